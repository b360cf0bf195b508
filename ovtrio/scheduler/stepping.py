"""How the loop steps the engine, chosen before each run of steps.

Four ways, each in one place:

- RUNS (Scheduler._start_run): the GIL-free step (engine_step.py), in runs: the worker
  thread steps on by itself while the loop has nothing to do between steps, and reads
  the handles after each step (Scheduler._after_step).
- ONE_STEP (Scheduler._start_run): the GIL-free step, one step per hand-off, its handles
  read by the worker: while long prompts are sliced or a consumer lags (the loop has
  work between steps), or with step runs turned off.
- WHEN_IDLE (Scheduler._start_run, step_thread.py): the binding's `step()`, which holds
  the GIL, one step started once the event loop is idle; the loop reads the handles.
  The fallback when the GIL-free step is off or fails its checks, and the way every
  step goes while a first step may throw (FirstSteps, below).
- the stateful backend (stateful.py): `generate()` in a worker thread, one request at
  a time; no steps to choose.

Why the first steps matter: a C++ exception cannot cross the ctypes call of the
GIL-free step, so one thrown inside it ends the process (std::terminate), while the
binding's `step()` turns it into a RuntimeError that fails the batch and lets the
server go on. engine_step.py lists what `step()` can throw. The one thing a request
brings that makes a step throw is what the engine builds for it the first time it is
scheduled: its sampler state (LogitProcessor), with the grammar of its output
constraint compiled by XGrammar, and the transforms of its sampling settings. So every
step goes through the binding while an engine request whose settings were never stepped
before (or whose constraint was never compiled before) has not had its first step.
The price: the event loop pauses during those steps, as with the binding's step
throughout (one step, bounded by the step's token budget and, for a long prompt, by its
slices; once per new settings, and once per request with an output constraint not seen
before).
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from typing import Any

from ovtrio.scheduler.params import SamplingParams
from ovtrio.scheduler.requests import EngineRequest

# Settings (and constraints) remembered as stepped without a fault, by hash (a schema
# can be large); the oldest are forgotten past this many (a client sending a new schema
# with every request).
REMEMBERED = 4096


class Stepping(enum.Enum):
    RUNS = "GIL-free runs"
    ONE_STEP = "GIL-free, one step per hand-off"
    WHEN_IDLE = "the binding's step when the loop is idle"


def choose_stepping(gil_free: bool, first_step_due: bool, runs: bool) -> Stepping:
    """How to step next: the binding's step without a GIL-free one or while a first
    step may throw (`first_step_due`), else GIL-free runs if `runs` (the loop has nothing
    to do between steps), else one GIL-free step."""
    if not gil_free or first_step_due:
        return Stepping.WHEN_IDLE
    return Stepping.RUNS if runs else Stepping.ONE_STEP


def first_step_key(params: SamplingParams) -> Hashable:
    """What the engine builds for a request at its first step, as far as it can throw:
    its output constraint (compiled to a grammar), and which of the sampler's code paths
    and logit transforms its settings take (openvino.genai's LogitProcessor and
    Sampler)."""
    return (
        params.constraint,
        params.beam_search,
        params.diversity_penalty > 0,  # beam groups
        params.greedy,
        params.logprobs,
        params.min_new_tokens > 0,
        bool(params.stop_token_ids),
        params.repetition_penalty != 1.0,
        params.presence_penalty != 0.0,
        params.frequency_penalty != 0.0,
        params.top_k is not None and params.top_k > 0,
        params.min_p > 0,
        params.top_p < 1.0,
        params.speculative,
    )


class FirstSteps:
    """The engine requests whose first step may throw: added with settings (see
    first_step_key) that no step has run without a fault since the server started, and
    not yet through a step. While there are any, the loop steps with the binding
    (choose_stepping)."""

    def __init__(self) -> None:
        self._due: dict[EngineRequest, int] = {}
        self._proven: dict[int, None] = {}  # hashes of first_step_key, oldest first

    @property
    def due(self) -> bool:
        return bool(self._due)

    def added(self, part: EngineRequest, params: SamplingParams) -> EngineRequest:
        """Register an engine request just added (between steps); returns it."""
        key = hash(first_step_key(params))
        if key not in self._proven:
            self._due[part] = key
        return part

    def stepped(self, running_status: Any) -> None:
        """After a step through the binding that returned, and before its handles are
        read (between steps): an engine request with output has had its first step, and
        its settings are proven; one whose request ended (its handle dropped before the
        step) or that the engine stopped (status not `running_status`) has left the
        engine."""
        for part, key in list(self._due.items()):
            handle = part.handle
            if handle is not None and handle.can_read():
                self._prove(key)
            elif handle is not None and handle.get_status() == running_status:
                continue
            del self._due[part]

    def _prove(self, key: int) -> None:
        self._proven[key] = None
        if len(self._proven) > REMEMBERED:
            del self._proven[next(iter(self._proven))]
