"""What the API layer and the service use of a scheduler, whichever backend runs it: the
continuous-batching Scheduler (scheduler.py) or the one-at-a-time StatefulScheduler
(stateful.py)."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Protocol

import trio

from ovtrio.scheduler.params import GenerationRequest
from ovtrio.scheduler.requests import RequestStream
from ovtrio.scheduler.scheduler import SchedulerStats


class GenerationScheduler(Protocol):
    def check_capacity(self) -> None: ...

    def submit(self, request: GenerationRequest) -> AbstractAsyncContextManager[RequestStream]: ...

    def drain(self) -> None: ...

    @property
    def in_flight(self) -> int: ...

    async def idle(self) -> None: ...

    def fail_all(self, message: str, code: str = ..., *, waiting: bool = True) -> int: ...

    def stats(self) -> SchedulerStats: ...

    async def run(self, *, task_status: trio.TaskStatus[None] = ...) -> None: ...
