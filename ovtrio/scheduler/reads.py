"""What is read off the engine after a step, as named records, and the read itself.

After each step every request's handles are read: the worker thread of a run reads the
handles planned when the run began (`read_engine` on a list of PlannedRead, between two
of its steps), or the loop reads them itself when no step is in flight. What comes back
(EngineReads) goes to the loop, which turns it into StepOutputs, one per choice and step
(Delivery.outputs_from), and delivers them (Delivery.deliver). scheduler.py's docstring
says why a handle is read only between steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ovtrio.scheduler.requests import ActiveRequest, EngineRequest, Sequence


@dataclass(slots=True)
class HandleOutput:
    """What a handle held for one of its outputs (one choice): the new token ids, their
    log-probabilities, and the engine's finish reason (GenerationFinishReason)."""

    ids: list[int]
    logprobs: list[float]
    finish_reason: Any


@dataclass(frozen=True, slots=True)
class PlannedRead:
    """An engine request to read after a step, with its handle (held here, so a request
    that ends meanwhile, which drops its handles, is still read safely)."""

    active: ActiveRequest
    part: EngineRequest
    handle: Any


@dataclass(frozen=True, slots=True)
class EngineRead:
    """What one planned handle held after a step, per output, and its status."""

    active: ActiveRequest
    part: EngineRequest
    outputs: list[HandleOutput]
    status: Any  # GenerationStatus


@dataclass(frozen=True, slots=True)
class EngineReads:
    """One read of every planned handle: when (one clock reading stands for all its
    outputs) and what each held."""

    read_at: float
    entries: list[EngineRead]


@dataclass(frozen=True, slots=True)
class StepOutput:
    """What one step produced for one choice: its request, engine request and sequence,
    the new ids and their log-probabilities, and the finish reason if it ended."""

    active: ActiveRequest
    part: EngineRequest
    sequence: Sequence
    ids: list[int]
    logprobs: list[float]
    finish_reason: str | None


def read_engine(plan: list[PlannedRead]) -> EngineReads:
    """Read every planned handle: what it holds and its status. Call between steps only
    (a request read while a step runs could be seen finished before its last tokens);
    any thread, as long as it is the one that runs the steps or no step is in flight."""
    read_at = time.monotonic()
    entries = [
        EngineRead(read.active, read.part, _read_all(read.handle, read.part.beam_search), read.handle.get_status())
        for read in plan
    ]
    return EngineReads(read_at, entries)


def joined(earlier: list[HandleOutput], later: list[HandleOutput]) -> list[HandleOutput]:
    """Two reads of one handle as one, output by output (the later finish reason wins).
    Extends `earlier` in place and returns it."""
    for i, output in enumerate(later):
        if i == len(earlier):
            earlier.append(HandleOutput([], [], None))
        into = earlier[i]
        into.ids.extend(output.ids)
        into.logprobs.extend(output.logprobs)
        into.finish_reason = output.finish_reason
    return earlier


def _read_all(handle: Any, beam_search: bool) -> list[HandleOutput]:
    """Everything a handle holds, per output.

    The engine queues one output per step in the handle and `read()` takes one, so a
    handle left unread (a paused request) holds many; they are joined here. Call only
    when `can_read()` (`read()` would wait, holding the GIL).
    """
    held: list[HandleOutput] = []
    while handle.can_read():
        outputs = list(handle.read().values())
        if beam_search:
            # Beam ids are arbitrary; choices are numbered best first.
            outputs.sort(key=lambda output: output.score, reverse=True)
        joined(held, [HandleOutput(o.generated_ids, o.generated_log_probs, o.finish_reason) for o in outputs])
    return held
