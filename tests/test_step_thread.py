"""The hand-off between the scheduler's trio task and the thread that steps the engine.

Pure logic: the steps here are stand-ins that block in C (as the engine's GIL-free step
does) until the test lets them finish.
"""

from __future__ import annotations

import threading

import pytest
import trio

from ovtrio.scheduler.engine_step import EngineStep
from ovtrio.scheduler.step_thread import StepThread


def blocking_step(release: threading.Event, releases_gil: bool = True) -> EngineStep:
    return EngineStep(release.wait, releases_gil=releases_gil, description="waits for the test")


async def test_the_event_loop_runs_while_a_step_is_in_flight():
    release = threading.Event()
    stepper = StepThread(blocking_step(release))
    stepper.start()
    # start() returns once the worker is inside the step, and trio goes on running.
    assert stepper.inside_step
    ran = 0
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(trio.sleep, 0)
            ran += 1
    assert ran == 3 and stepper.inside_step and stepper.finished == 0
    release.set()
    await stepper.wait()
    assert not stepper.inside_step
    assert (stepper.entered, stepper.finished) == (1, 1)


async def test_one_step_at_a_time():
    release = threading.Event()
    stepper = StepThread(blocking_step(release))
    stepper.start()
    with pytest.raises(RuntimeError, match="already in flight"):
        stepper.start()
    release.set()
    await stepper.wait()
    stepper.start()  # the next step may start once the last one is over
    await stepper.wait()
    assert stepper.entered == 2


async def test_a_failed_step_raises_in_the_waiting_task():
    def failing() -> None:
        raise RuntimeError("engine fault")

    stepper = StepThread(EngineStep(failing, releases_gil=True, description="fails"))
    stepper.start()
    with pytest.raises(RuntimeError, match="engine fault"):
        await stepper.wait()
    assert not stepper.inside_step


async def test_cancellation_waits_for_the_step_to_end():
    """The engine is never left mid-step: a cancelled wait returns only after the step."""
    release = threading.Event()
    stepper = StepThread(blocking_step(release))
    stepper.start()
    timer = threading.Timer(0.05, release.set)
    timer.start()
    with trio.CancelScope() as scope:
        scope.cancel()
        await stepper.wait()
    assert scope.cancelled_caught
    assert stepper.finished == 1
    timer.join()


async def test_a_step_that_holds_the_gil_also_runs_in_the_thread():
    calls: list[str] = []
    stepper = StepThread(EngineStep(lambda: calls.append(threading.current_thread().name), False, "binding"))
    assert not stepper.releases_gil
    stepper.start()
    await stepper.wait()
    assert calls and calls[0] != threading.main_thread().name


async def test_a_step_that_holds_the_gil_waits_until_the_loop_is_idle():
    """Every ready task runs before a step that will pause the event loop begins."""
    order: list[str] = []
    stepper = StepThread(EngineStep(lambda: order.append("step"), False, "binding"))

    async def busy(name: str) -> None:
        for _ in range(5):
            await trio.lowlevel.checkpoint()
        order.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(busy, "first")
        nursery.start_soon(busy, "second")
        await trio.lowlevel.checkpoint()  # both tasks are running now
        stepper.start(when_idle=True)
        await stepper.wait()
    stepper.close()
    assert sorted(order[:2]) == ["first", "second"] and order[2] == "step"
