"""Engine steps run in a worker thread; the trio task that owns the engine awaits them.

Why a thread: an engine step is CPU work of 10 ms to seconds. Run on the trio thread it
stops the event loop for that long (no /health, no SSE writes, no new connections).
In a worker thread, with a step that releases the GIL (engine_step.py), the loop keeps
serving while the engine computes.

Why this and not `trio.to_thread.run_sync`: the scheduler wants to *start* a step, do
its own work while the step runs (hand the previous step's tokens to their streams), and
only then wait. `start()` hands the step to a thread at once; `wait()` awaits its end.
One step at a time: the engine has one owner, and `start()` refuses a second step.

The hand-off when the step releases the GIL: `start()` blocks the trio thread until the
worker has entered the step (microseconds: the worker needs the GIL only to make the
call, which then releases it). Without that, the worker would wait for the GIL until the
trio thread gave it up, up to the interpreter's switch interval (5 ms) later, and the
engine would sit idle meanwhile.

A step that holds the GIL (the binding's) pauses the event loop until it ends, so it
should start only once the loop has nothing left to do: every handler has written its
chunk and read what arrived. `start(when_idle=True)` waits for exactly that moment: a
trio instrument sees the run loop about to block waiting for I/O with no task ready
(`before_io_wait` with a timeout), and starts the step there. This is where trio itself
decides it is idle, so nothing is polled or guessed.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import trio

from ovtrio.scheduler.engine_step import EngineStep


class _WhenIdle(trio.abc.Instrument):
    """Runs one queued callable when the run loop is about to wait for I/O, idle."""

    def __init__(self) -> None:
        self.queued: Any = None

    def before_io_wait(self, timeout: float) -> None:
        if self.queued is not None and timeout > 0:
            launch, self.queued = self.queued, None
            launch()


class StepThread:
    def __init__(self, step: EngineStep) -> None:
        self._step = step
        self._when_idle: _WhenIdle | None = None
        self._done = trio.Event()
        self._done.set()
        self._result: Any = None
        self._pending = False
        self.last_seconds = 0.0
        # Written by the worker thread around the engine call itself, so they say where
        # the engine is, not where the loop task is. With a step that holds the GIL no
        # other thread ever sees them differ.
        self.entered = 0
        self.finished = 0

    @property
    def releases_gil(self) -> bool:
        return self._step.releases_gil

    @property
    def inside_step(self) -> bool:
        """True while the worker thread is inside the engine's step."""
        return self.entered != self.finished

    def start(self, when_idle: bool = False) -> None:
        """Begin one engine step in a worker thread. Call from the trio thread.

        With `when_idle`, the step begins once the event loop has no task ready to run
        (for a step that holds the GIL); otherwise at once.
        """
        if self._pending:
            raise RuntimeError("an engine step is already in flight")
        if when_idle:
            if self._when_idle is None:
                self._when_idle = _WhenIdle()
                trio.lowlevel.add_instrument(self._when_idle)
            self._pending = True
            self._done = trio.Event()
            self._when_idle.queued = self._launch
            return
        self._pending = True
        self._done = trio.Event()
        self._launch()

    def close(self) -> None:
        """Remove the idle instrument, if start(when_idle=True) installed one."""
        if self._when_idle is not None:
            trio.lowlevel.remove_instrument(self._when_idle)
            self._when_idle = None

    def _launch(self) -> None:
        token = trio.lowlevel.current_trio_token()
        handed_over = threading.Event() if self._step.releases_gil else None
        run = self._step.run

        def step() -> None:
            self.entered += 1
            if handed_over is not None:
                handed_over.set()
            began = time.perf_counter()
            try:
                run()
            finally:
                self.last_seconds = time.perf_counter() - began
                self.finished += 1

        def deliver(result: Any) -> None:  # in the worker thread, result an outcome.Outcome
            try:
                token.run_sync_soon(self._finish, result)
            except trio.RunFinishedError:  # the event loop is gone: nobody waits any more
                pass

        trio.lowlevel.start_thread_soon(step, deliver, name="ovtrio engine step")
        if handed_over is not None:
            handed_over.wait()

    def _finish(self, result: Any) -> None:
        self._result = result
        self._pending = False
        self._done.set()

    async def wait(self) -> None:
        """Wait for the step in flight; raise what it raised.

        Not cancellable while the step runs: the engine must not be left mid-step (and
        the pipeline torn down under the worker) when the server shuts down. A pending
        cancellation is raised once the step is over.
        """
        with trio.CancelScope(shield=True):
            await self._done.wait()
        result, self._result = self._result, None
        if result is not None:
            result.unwrap()
        await trio.lowlevel.checkpoint_if_cancelled()
