"""What the API layer and the service use of a scheduler, whichever backend runs it: the
continuous-batching Scheduler (scheduler.py) or the one-at-a-time StatefulScheduler
(stateful.py), and the counters both report (SchedulerStats)."""

from __future__ import annotations

import dataclasses
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

import trio

from ovtrio.scheduler.params import GenerationRequest
from ovtrio.scheduler.requests import RequestStream


@dataclass(frozen=True)
class SchedulerStats:
    running: int  # requests in the engine
    queued: int  # requests queued for room in the engine
    running_sequences: int  # engine sequences of the running requests
    paused: int  # running requests whose consumer lags (see admission.py)
    rejected: int  # requests refused with Overloaded, ever
    slow_readers_cancelled: int  # requests cancelled because their consumer stopped reading, ever
    engine_requests: int
    engine_scheduled: int
    waiting: int  # engine requests not in the last step (waiting_requests)
    kv_cache_usage: float  # percent
    steps: int
    step_seconds: float
    prompt_tokens: int  # of the requests added to the engine
    generated_tokens: int
    steps_started: int  # engine steps entered, empty ones included
    step_in_flight: bool  # the engine is inside a step right now
    step_releases_gil: bool
    # Slices of long prompts added to the engine (prefill_policy.py), and their tokens, ever.
    prefill_slices: int = 0
    prefill_slice_tokens: int = 0


# The fields of SchedulerStats that only grow. A model loaded again runs a new scheduler;
# its metrics go on from the totals of its earlier loads (added_to).
COUNTER_FIELDS = (
    "rejected",
    "slow_readers_cancelled",
    "steps",
    "step_seconds",
    "prompt_tokens",
    "generated_tokens",
    "steps_started",
    "prefill_slices",
    "prefill_slice_tokens",
)


def added_to(earlier: SchedulerStats | None, stats: SchedulerStats) -> SchedulerStats:
    """`stats` with the counters of `earlier` (the totals of a model's earlier loads) added."""
    if earlier is None:
        return stats
    totals = {name: getattr(earlier, name) + getattr(stats, name) for name in COUNTER_FIELDS}
    return dataclasses.replace(stats, **totals)


def waiting_requests(queued: int, engine_requests: int, engine_scheduled: int) -> int:
    """Engine requests that wait for the engine: those of requests queued for room in it
    (`queued`, added between two steps), and those it holds but did not schedule in its
    last step (its metrics' requests - scheduled_requests)."""
    return queued + max(0, engine_requests - engine_scheduled)


class GenerationScheduler(Protocol):
    def check_capacity(self) -> None: ...

    async def checked(self, request: GenerationRequest) -> GenerationRequest: ...

    def submit(self, request: GenerationRequest) -> AbstractAsyncContextManager[RequestStream]: ...

    def drain(self) -> None: ...

    @property
    def in_flight(self) -> int: ...

    async def idle(self) -> None: ...

    def fail_all(self, message: str, code: str = ..., *, waiting: bool = True) -> int: ...

    def stats(self) -> SchedulerStats: ...

    async def run(self, *, task_status: trio.TaskStatus[None] = ...) -> None: ...
