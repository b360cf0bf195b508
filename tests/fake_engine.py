"""A small fake of OpenVINO GenAI's continuous-batching pipeline, for the scheduler's
pure-logic tests: each engine request makes a token "a" per step until max_new_tokens,
and its handle queues one output per step, as the real one does (`read()` takes one). Each
handle keeps the prompt it was added with; `gate`, when set to a cleared
threading.Event, holds every step until it is set. A text prompt with images (a
vision-language model's `add_request(id, text, images, config)`) is added as the prompt
[1]; `add_gate` holds such adds as `gate` holds steps, and `add_threads` records the
thread of each."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import openvino_genai
import trio

from ovtrio.scheduler import AdmissionLimits, GenerationRequest, SamplingParams, Scheduler
from ovtrio.scheduler.engine_step import EngineStep
from ovtrio.text.vocabulary import Vocabulary

Status = openvino_genai.GenerationStatus
Reason = openvino_genai.GenerationFinishReason

# Token 1 is "a"; a prompt that starts with token 2 is one the fake engine drops as out
# of memory.
VOCABULARY = Vocabulary([b"</s>", b"a", b"b"], frozenset({0}))
DROPPED_PROMPT = [2]
# A prompt that starts with token 3 is one whose add_request raises, as the engine's
# does for a grammar it cannot compile.
REFUSED_PROMPT = [3]
# A text prompt that starts with this is refused the same way.
REFUSED_TEXT = "refuse"


@dataclass
class FakeOutput:
    generated_ids: list[int]
    generated_log_probs: list[float]
    score: float
    finish_reason: Any


@dataclass
class FakeHandle:
    """One engine request: a token "a" per step until max_new_tokens."""

    left: int
    dropped: bool
    prompt: list[int] = field(default_factory=list)
    added_after_step: int = 0  # steps the pipeline had run when it was added
    status: Any = Status.RUNNING
    cancelled: bool = False
    unread: list[FakeOutput] = field(default_factory=list)  # one per step

    def can_read(self) -> bool:
        return bool(self.unread)

    def read(self) -> dict[int, FakeOutput]:
        return {0: self.unread.pop(0)}

    def get_status(self) -> Any:
        return self.status

    def cancel(self) -> None:
        self.cancelled = True
        self.status = Status.CANCEL


class FakePipeline:
    def __init__(self) -> None:
        self.handles: list[FakeHandle] = []
        self.failing_steps = 0
        self.gate: threading.Event | None = None
        self.steps = 0
        self.add_gate: threading.Event | None = None
        self.adding = threading.Event()  # set when an add with images has begun
        self.add_threads: list[int] = []
        # Raised by the next adds, one each, whatever the prompt (what the binding may raise).
        self.add_errors: list[Exception] = []
        self.token = 1  # the token each step writes (a real tokenizer's "a" is another id)

    def get_config(self) -> Any:
        return SimpleNamespace(stop_token_ids={0})

    def add_request(self, request_id: int, prompt: Any, *images_and_config: Any) -> FakeHandle:
        *images, config = images_and_config
        if self.add_errors:
            raise self.add_errors.pop(0)
        if images:  # a text prompt and its images
            self.add_threads.append(threading.get_ident())
            self.adding.set()
            if self.add_gate is not None and self.add_gate.wait(120) is False:
                raise RuntimeError("the test never let the add go")  # one that failed holding it still ends
            ids = [3] if prompt.startswith(REFUSED_TEXT) else [1]
        else:
            ids = prompt.data[0].tolist()
        if ids[:1] == REFUSED_PROMPT:
            raise RuntimeError("the engine refuses this request")
        handle = FakeHandle(config.max_new_tokens, ids[:1] == DROPPED_PROMPT, ids, self.steps)
        self.handles.append(handle)
        return handle

    def _running(self) -> list[FakeHandle]:
        return [h for h in self.handles if h.status == Status.RUNNING]

    def has_non_finished_requests(self) -> bool:
        return bool(self._running())

    def step(self) -> None:
        if self.gate is not None and self.gate.wait(120) is False:
            # Not stepped on: a step let go by the clock would break the order a test holds it for.
            raise RuntimeError("the test never opened the gate")  # one that failed holding it still ends
        self.steps += 1
        if self.failing_steps:
            self.failing_steps -= 1
            raise RuntimeError("boom")
        for handle in self._running():
            if handle.dropped:
                handle.status = Status.IGNORED
                continue
            handle.left -= 1
            if handle.left == 0:
                handle.status = Status.FINISHED
            reason = Reason.LENGTH if handle.left == 0 else Reason.NONE
            handle.unread.append(FakeOutput([self.token], [0.0], 0.0, reason))

    def get_metrics(self) -> Any:
        return SimpleNamespace(requests=len(self._running()), scheduled_requests=0, cache_usage=0.0)


def request(max_new_tokens: int, prompt: list[int] | None = None, **params: Any) -> GenerationRequest:
    sampling = SamplingParams(max_new_tokens=max_new_tokens, **{"temperature": 0.0, **params})
    return GenerationRequest([[1] if prompt is None else prompt], sampling)


async def received(scheduler: Scheduler, generation: GenerationRequest) -> list[Any]:
    """Every message of one request, to the end of its channel."""
    messages: list[Any] = []
    async with scheduler.submit(generation) as stream:
        while batch := await stream.receive_available():
            messages += batch
    return messages


class Observed:
    """What the scheduler reported to its RequestObserver: queue and first-token times
    per choice, and each choice's end ("length 1+3": reason, prompt + generated tokens;
    or "abort", "error")."""

    def __init__(self) -> None:
        self.queued_seconds: list[float] = []
        self.first_token_seconds: list[float] = []
        self.ends: list[str] = []

    @property
    def first_tokens(self) -> int:
        return len(self.first_token_seconds)

    def queued(self, seconds: float) -> None:
        assert seconds >= 0
        self.queued_seconds.append(seconds)

    def first_token(self, seconds: float) -> None:
        self.first_token_seconds.append(seconds)

    def inter_token(self, seconds: float) -> None:
        assert seconds >= 0

    def finished(self, reason, prompt_tokens, generation_tokens, e2e, time_per_output_token) -> None:
        self.ends.append(f"{reason} {prompt_tokens}+{generation_tokens}")

    def ended(self, reason: str) -> None:
        self.ends.append(reason)


async def start_scheduler(
    nursery: trio.Nursery,
    limits: AdmissionLimits = AdmissionLimits(),
    prefill_slice_tokens: int = 0,
    step_tokens: int = 256,
    kv_block_tokens: int = 32,
    gil_free: bool = False,
    tokenizer: Any = None,
    prefill_whole_above: int = 0,
    max_itl_seconds: float | None = None,
) -> SimpleNamespace:
    """A scheduler over a FakePipeline, running in `nursery`: its pipeline, the scheduler,
    what it told its observer (`observed`), and `stop()`, which cancels its loop.

    With `gil_free`, the scheduler steps as it does with the engine's GIL-free step: runs
    of steps that its worker thread continues by itself. Each fake step then sleeps a
    millisecond first, which lets other threads run, as a real GIL-free step does.
    With a `tokenizer`, the scheduler detokenizes through its `decode()` instead of the
    fake's byte table."""
    pipeline = FakePipeline()
    observed = Observed()

    def gil_free_step() -> None:
        time.sleep(0.001)
        pipeline.step()

    step = EngineStep(gil_free_step, releases_gil=True, description="fake GIL-free") if gil_free else None
    scheduler = Scheduler(
        pipeline,
        tokenizer,
        VOCABULARY if tokenizer is None else None,
        step=step,
        limits=limits,
        observer=observed,
        prefill_slice_tokens=prefill_slice_tokens,
        step_tokens=step_tokens,
        kv_block_tokens=kv_block_tokens,
        prefill_whole_above=prefill_whole_above,
        max_itl_seconds=max_itl_seconds,
    )
    scope = trio.CancelScope()

    async def run(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            await scheduler.run(task_status=task_status)

    await nursery.start(run)
    # The loop's first, empty step (it releases what the engine finished before the
    # loop began) runs in a worker thread: let it end before a test arranges a fault.
    while scheduler.stats().steps_started == 0 or scheduler.stats().step_in_flight:
        await trio.sleep(0.005)
    return SimpleNamespace(pipeline=pipeline, scheduler=scheduler, stop=scope.cancel, observed=observed)
