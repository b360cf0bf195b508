"""Engine steps run in a worker thread; the trio task that owns the engine awaits them.

Why a thread: an engine step is CPU work of milliseconds to seconds (see
docs/benchmarks.md#stepping-and-the-event-loop). Run on the trio thread it
stops the event loop for that long (no /health, no SSE writes, no new connections).
In a worker thread, with a step that releases the GIL (engine_step.py), the loop keeps
serving while the engine computes.

Why this and not `trio.to_thread.run_sync`: the scheduler wants to *start* steps, do its
own work while they run (hand the previous step's tokens to their streams), and collect
each step's result as it comes. `start()` hands a run of steps to a thread at once;
`wait()` awaits the next step's result. One run at a time: the engine has one owner, and
`start()` refuses a second run while one is in flight.

A run of steps: with `after_step`, the worker calls it after each step, still between
steps (it reads what the step produced), and steps again by itself while it says there
is more to do and the loop has not asked for the engine (`hand_back()`). The loop then
gets each step's result while the next step already runs. Why: handing every step back
to the trio task costs a round trip of thread wake-ups (the worker wakes the event loop,
which wakes the worker again), during which the engine sits idle (see
docs/benchmarks.md#stepping-and-the-event-loop). A run keeps the engine busy and
leaves only the reads between its steps. Without
`after_step`, a run is one step.

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
decides it is idle, so nothing is polled or guessed. Such a run is always one step: a
worker stepping on by itself would hold the GIL between steps too.

A run may step the engine another way than the thread's own (`start(step=...)`): the
scheduler takes the binding's step for a step that may throw (stepping.py).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar

import outcome
import trio

from ovtrio.constraints.cache import EngineGrammars
from ovtrio.scheduler.engine_step import EngineStep

Value = TypeVar("Value")


@dataclass(frozen=True, slots=True)
class AfterStep(Generic[Value]):
    """What `after_step` returns: what it read, for wait()'s StepResult, and whether the
    worker is to step again at once (unless hand_back() was asked)."""

    value: Value
    step_again: bool


@dataclass(frozen=True, slots=True)
class StepResult(Generic[Value]):
    """One step of a run: what `after_step` read (None without it), the step's own
    duration, and whether the run ended with it (the engine is then between steps and
    the loop may call it)."""

    value: Value | None
    seconds: float
    last: bool


class _WhenIdle(trio.abc.Instrument):
    """Runs one queued callable when the run loop is about to wait for I/O, idle."""

    def __init__(self) -> None:
        self.queued: Any = None

    def before_io_wait(self, timeout: float) -> None:
        if self.queued is not None and timeout > 0:
            launch, self.queued = self.queued, None
            launch()


class StepThread(Generic[Value]):
    def __init__(self, step: EngineStep, grammars: EngineGrammars | None = None) -> None:
        """`step`: how to step the engine, unless a run asks for another (start).
        `grammars`: the engine's grammar compilers, which its steps build (ovtrio/constraints/cache.py)."""
        self._step = step
        self._grammars = grammars or EngineGrammars()
        self._when_idle: _WhenIdle | None = None
        # Each step's outcome (a StepResult, or the error that ended the run), in order.
        self._results: deque[outcome.Outcome] = deque()
        self._arrived = trio.Event()
        self._pending = False
        # Set by the loop (hand_back), read by the worker after each step.
        self._hand_back = False
        # Written by the worker thread around the engine call itself, so they say where
        # the engine is, not where the loop task is. With a step that holds the GIL no
        # other thread ever sees them differ.
        self.entered = 0
        self.finished = 0

    @property
    def releases_gil(self) -> bool:
        """Whether its own step (not one a run asked for) releases the GIL."""
        return self._step.releases_gil

    @property
    def inside_step(self) -> bool:
        """True while the worker thread is inside the engine's step."""
        return self.entered != self.finished

    @property
    def running(self) -> bool:
        """True from start() until wait() has returned the run's last step."""
        return self._pending

    def assert_between_steps(self, call: str) -> None:
        """For the engine calls that must not overlap a step (the scheduler's rule)."""
        assert not self._pending, f"{call} while an engine step is in flight"

    def start(
        self,
        when_idle: bool = False,
        after_step: Callable[[], AfterStep[Value]] | None = None,
        step: EngineStep | None = None,
    ) -> None:
        """Begin a run of engine steps in a worker thread. Call from the trio thread.

        `after_step()` is called in the worker after each step: what it read goes to
        wait()'s StepResult, and the worker steps again if it says so and no
        hand_back() was asked. It runs between steps, so it may read the engine; it
        holds the GIL while it runs. Without it the run is one step. With `when_idle`
        (for a step that holds the GIL), the run is one step and begins once the event
        loop has no task ready to run; otherwise at once. `step`: how to step the engine
        in this run, instead of the thread's own step.
        """
        if self._pending:
            raise RuntimeError("an engine step is already in flight")
        run_step = step or self._step
        self._pending = True
        self._hand_back = False
        if when_idle:
            if self._when_idle is None:
                self._when_idle = _WhenIdle()
                trio.lowlevel.add_instrument(self._when_idle)
            self._when_idle.queued = partial(self._launch_when_idle, run_step)
            return
        try:
            self._launch(run_step, after_step if run_step.releases_gil else None)
        except BaseException:
            self._pending = False
            raise

    def hand_back(self) -> None:
        """Ask the worker to end the run after the step in flight (any thread)."""
        self._hand_back = True

    def close(self) -> None:
        """Remove the idle instrument, if start(when_idle=True) installed one."""
        if self._when_idle is not None:
            trio.lowlevel.remove_instrument(self._when_idle)
            self._when_idle = None

    def _launch_when_idle(self, step: EngineStep) -> None:
        # Called by the instrument. An exception escaping an instrument makes trio
        # drop the instrument and log it, and the shielded wait() would never return:
        # the waiting task gets the error as the run's outcome instead. Posted, not
        # handed over here: the loop is about to wait for I/O with the timeout it has
        # computed, and would sleep until then (its next deadline) before the task runs.
        try:
            self._launch(step, None)
        except Exception as exc:  # noqa: BLE001 (handed to the waiting task)
            trio.lowlevel.current_trio_token().run_sync_soon(self._arrive, outcome.Error(exc))

    def _launch(self, step: EngineStep, after_step: Callable[[], AfterStep[Value]] | None) -> None:
        token = trio.lowlevel.current_trio_token()
        handed_over = threading.Event() if step.releases_gil else None
        run = step.run

        def post(result: outcome.Outcome) -> None:
            try:
                token.run_sync_soon(self._arrive, result)
            except trio.RunFinishedError:  # the event loop is gone: nobody waits any more
                pass

        def steps() -> StepResult[Value]:
            with self._grammars.building():
                return stepped()

        def stepped() -> StepResult[Value]:
            while True:
                self.entered += 1
                if handed_over is not None:
                    handed_over.set()
                began = time.perf_counter()
                try:
                    run()
                finally:
                    seconds = time.perf_counter() - began
                    self.finished += 1
                if after_step is None:
                    return StepResult(None, seconds, last=True)
                read = after_step()
                if not read.step_again or self._hand_back:
                    return StepResult(read.value, seconds, last=True)
                post(outcome.Value(StepResult(read.value, seconds, last=False)))

        trio.lowlevel.start_thread_soon(steps, post, name="ovtrio engine step")
        if handed_over is not None:
            handed_over.wait()

    def _arrive(self, result: outcome.Outcome) -> None:
        self._results.append(result)
        self._arrived.set()

    async def wait(self) -> StepResult[Value]:
        """The next step's result; raise what the run raised (which ends it).

        Not cancellable while a run is in flight: the engine must not be left mid-step
        (and the pipeline torn down under the worker) when the server shuts down. On
        cancellation the worker is asked to end the run, every step left is awaited, and
        then the cancellation is raised.
        """
        with trio.CancelScope(shield=True):
            result = await self._next()
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
        except trio.Cancelled:
            if self._pending:
                self.hand_back()
                with trio.CancelScope(shield=True):
                    while self._pending:
                        try:
                            await self._next()
                        except Exception:  # noqa: BLE001 (the run ends either way; the cancellation wins)
                            pass
            raise
        return result

    async def _next(self) -> StepResult[Value]:
        while not self._results:
            self._arrived = trio.Event()
            await self._arrived.wait()
        result = self._results.popleft()
        if not isinstance(result, outcome.Value) or result.value.last:
            self._pending = False
        return result.unwrap()
