"""Holding an in-process server's fake engine (tests/in_process.py) mid-generation, so
requests stay running for as long as a test needs: a policy about running and queued
requests is then tested on a state that lasts, not on a race with generations that end
in milliseconds."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from fake_engine import FakeHandle, FakePipeline, Status
from in_process import InProcessServer


class _Outputs(list[Any]):
    """A held handle's queue of outputs: what a step appends while it is held is dropped."""

    def __init__(self, items: list[Any], held: HeldSteps, handle: FakeHandle) -> None:
        super().__init__(items)
        self._held = held
        self._handle = handle

    def append(self, item: Any) -> None:
        if not self._held.holds(self._handle):
            super().append(item)


class HeldSteps(threading.Event):
    """The gate (FakePipeline.gate) of a held fake engine: while held, a step writes one
    token for each request that has none yet and nothing for the others (a step of a few
    milliseconds, as an engine's step that schedules no one's tokens). Every request the
    engine takes reaches its client's first token, then stays running; the scheduler
    takes new requests between steps as it always does. Once released, the steps are
    the fake's own. The gate is consulted, in the step's thread, as each step begins."""

    def __init__(self, pipeline: FakePipeline) -> None:
        super().__init__()
        self._pipeline = pipeline
        self._released = False
        self._written: set[int] = set()  # ids of the handles given their one token
        self._this_step: set[int] = set()  # ids of the handles the current step holds

    def release(self) -> None:
        """From the next step on, every request goes on."""
        self._released = True

    def holds(self, handle: FakeHandle) -> bool:
        return id(handle) in self._this_step

    def wait(self, timeout: float | None = None) -> bool:
        holding: set[int] = set()
        if not self._released:
            running = [handle for handle in self._pipeline.handles if handle.status == Status.RUNNING]
            for handle in running:
                if id(handle) not in self._written:
                    self._written.add(id(handle))
                    continue
                holding.add(id(handle))
                handle.left += 1  # the step's count of this token, which it does not write
                if not isinstance(handle.unread, _Outputs):
                    handle.unread = _Outputs(handle.unread, self, handle)
            if len(holding) == len(running):
                time.sleep(0.005)
        self._this_step = holding
        return True


@contextlib.contextmanager
def held_steps(server: InProcessServer, model: str) -> Iterator[HeldSteps]:
    """The fake engine of `model` (its newest load) held for the block; released (its
    requests go on) by `release()`, at the latest when the block ends."""
    pipeline = server.pipelines[model][-1]
    held = HeldSteps(pipeline)
    pipeline.gate = held
    try:
        yield held
    finally:
        held.release()
        pipeline.gate = None
