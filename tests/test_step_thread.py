"""The hand-off between the scheduler's trio task and the thread that steps the engine.

Pure logic: the steps here are stand-ins that block in C (as the engine's GIL-free step
does) until the test lets them finish.
"""

from __future__ import annotations

import threading

import pytest
import trio

from ovtrio.scheduler.engine_step import EngineStep
from ovtrio.scheduler.step_thread import AfterStep, StepThread


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


@pytest.mark.parametrize(
    "after_step", [None, lambda: AfterStep(None, True)], ids=["one step", "a run that would go on"]
)
async def test_cancellation_waits_for_the_step_to_end(after_step):
    """The engine is never left mid-step: a cancelled wait returns only after the step,
    and a run is handed back first, so no worker steps on once the caller has gone."""
    release = threading.Event()
    stepper = StepThread(blocking_step(release))
    stepper.start(after_step=after_step)
    timer = threading.Timer(0.05, release.set)
    timer.start()
    with trio.CancelScope() as scope:
        scope.cancel()
        await stepper.wait()
    assert scope.cancelled_caught
    assert not stepper.running and stepper.entered == stepper.finished >= 1
    steps = stepper.entered
    await trio.sleep(0.05)
    assert stepper.entered == steps  # nothing steps on after the caller has gone
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


# ---- runs of steps ------------------------------------------------------------------


def counting_steps() -> tuple[EngineStep, list[str]]:
    """A GIL-free stand-in step that records which thread ran it."""
    threads: list[str] = []
    return EngineStep(lambda: threads.append(threading.current_thread().name), True, "counts"), threads


async def test_a_run_steps_on_by_itself_while_after_step_asks_for_more():
    step, threads = counting_steps()
    stepper = StepThread(step)
    stepper.start(after_step=lambda: AfterStep(len(threads), len(threads) < 3))
    results = [await stepper.wait()]
    while not results[-1].last:
        results.append(await stepper.wait())
    # Three steps from one start(), each result carrying what after_step read after it.
    assert [r.value for r in results] == [1, 2, 3]
    assert [r.last for r in results] == [False, False, True]
    assert stepper.entered == 3 and not stepper.running
    assert len(set(threads)) == 1 and threads[0] != threading.main_thread().name
    stepper.start()  # the engine is free again: the next run may start
    assert (await stepper.wait()).last


async def test_each_result_arrives_while_the_next_step_runs():
    gates = [threading.Event() for _ in range(2)]

    def gated() -> None:
        gates[min(stepper.entered, 2) - 1].wait(10)

    stepper = StepThread(EngineStep(gated, True, "gated"))
    stepper.start(after_step=lambda: AfterStep(stepper.entered, stepper.entered < 2))
    gates[0].set()
    first = await stepper.wait()
    # The loop has the first step's result while the run goes on: the worker enters
    # the second step by itself (held at its gate), with no start() from the loop.
    assert (first.value, first.last) == (1, False) and stepper.running
    with trio.fail_after(5):
        while not (stepper.inside_step and stepper.entered == 2):
            await trio.sleep(0.001)
    with pytest.raises(RuntimeError, match="already in flight"):
        stepper.start()
    gates[1].set()
    second = await stepper.wait()
    assert (second.value, second.last) == (2, True)


async def test_hand_back_ends_the_run_after_the_step_in_flight():
    release = threading.Event()
    stepper = StepThread(blocking_step(release))
    stepper.start(after_step=lambda: AfterStep(stepper.entered, True))  # it would step forever
    assert stepper.inside_step
    stepper.hand_back()
    release.set()
    result = await stepper.wait()
    assert result.last and result.value == 1
    assert stepper.entered == stepper.finished == 1


async def test_a_step_that_fails_mid_run_ends_it_after_the_results_before():
    def step() -> None:
        if stepper.entered == 3:
            raise RuntimeError("engine fault")

    stepper = StepThread(EngineStep(step, True, "fails on the third"))
    stepper.start(after_step=lambda: AfterStep(stepper.entered, True))
    assert [(await stepper.wait()).value for _ in range(2)] == [1, 2]
    with pytest.raises(RuntimeError, match="engine fault"):
        await stepper.wait()
    assert not stepper.running and not stepper.inside_step


async def test_a_step_that_holds_the_gil_runs_one_step_per_run():
    """Stepping on by itself would hold the GIL between steps too: such runs are one
    step, and the loop reads the engine itself (no after_step value)."""
    calls: list[int] = []
    stepper = StepThread(EngineStep(lambda: calls.append(1), False, "binding"))
    stepper.start(after_step=lambda: AfterStep("read", True))
    result = await stepper.wait()
    assert result.last and result.value is None and len(calls) == 1


@pytest.mark.parametrize("when_idle", [True, False], ids=["when-idle", "at-once"])
async def test_a_step_that_cannot_be_launched_fails_the_waiting_task(monkeypatch, when_idle):
    def no_thread(*args: object, **kwargs: object) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(trio.lowlevel, "start_thread_soon", no_thread)
    stepper = StepThread(EngineStep(lambda: None, releases_gil=not when_idle, description="never runs"))
    try:
        with trio.fail_after(5):
            if when_idle:
                stepper.start(when_idle=True)
            else:
                with pytest.raises(RuntimeError, match="new thread"):
                    stepper.start()
            if when_idle:
                # The launch happens inside trio's idle instrument: the error reaches
                # the waiting task instead of vanishing with the instrument.
                with pytest.raises(RuntimeError, match="new thread"):
                    await stepper.wait()
        assert not stepper.running
        monkeypatch.undo()
        stepper.start(when_idle=when_idle)  # the next step can start
        await stepper.wait()
        assert stepper.finished == 1
    finally:
        stepper.close()
