"""Runs of steps: with a GIL-free step, the scheduler's worker thread steps the engine on
by itself while the loop has nothing to do between steps, and hands it back as soon as
the loop has (a request to add). Pure logic against the fake pipeline; how the
scheduler's other paths behave with runs is in test_scheduler_failures.py and
test_admission.py, which run with both ways of stepping."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio

from fake_engine import received, request, start_scheduler
from ovtrio.scheduler import Completed, Delta


class Gate:
    """Holds the fake engine's next step; says when a step is waiting at it."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.opened = threading.Event()

    def wait(self, timeout: float) -> bool:
        self.reached.set()
        return self.opened.wait(timeout)

    def set(self) -> None:
        self.opened.set()


def count_runs(scheduler: Any) -> list[int]:
    """Counts the runs the scheduler starts (one entry per start)."""
    stepper = scheduler._stepper
    starts: list[int] = []
    start = stepper.start

    def counted(*args: Any, **kwargs: Any) -> None:
        starts.append(stepper.entered)
        start(*args, **kwargs)

    stepper.start = counted
    return starts


async def test_a_lone_request_is_stepped_in_one_run(nursery):
    engine = await start_scheduler(nursery, gil_free=True)
    runs = count_runs(engine.scheduler)
    messages = await received(engine.scheduler, request(20))
    assert "".join(m.text for m in messages if isinstance(m, Delta)) == "a" * 20
    assert messages[-1] == Completed(prompt_tokens=1, completion_tokens=20)
    # Twenty steps, started once: the loop did not wait between them (its one other
    # start is the empty step that lets the engine release the finished request).
    assert engine.pipeline.steps >= 20
    assert len(runs) <= 2


async def test_a_request_that_arrives_during_a_run_is_added_after_the_step_in_flight(nursery):
    engine = await start_scheduler(nursery, gil_free=True)
    pipeline, scheduler = engine.pipeline, engine.scheduler
    results: dict[str, list[Any]] = {}

    async def run(name: str, max_new_tokens: int) -> None:
        results[name] = await received(scheduler, request(max_new_tokens))

    async with trio.open_nursery() as requests:
        requests.start_soon(run, "long", 1000)
        while pipeline.steps < 5:
            await trio.sleep(0.001)
        gate = pipeline.gate = Gate()
        while not gate.reached.is_set():
            await trio.sleep(0.001)
        held_step = pipeline.steps + 1  # the step waiting at the gate, counted once it ran
        requests.start_soon(run, "short", 2)
        while scheduler.stats().queued < 1:
            await trio.sleep(0.001)
        pipeline.gate = None
        gate.set()
        while len(pipeline.handles) < 2:
            await trio.sleep(0.001)
        # The run ended with the held step; the loop added the new request right after it.
        assert pipeline.handles[1].added_after_step == held_step
        assert pipeline.handles[0].left > 900  # the long request still runs meanwhile
        while "short" not in results:
            await trio.sleep(0.001)
        requests.cancel_scope.cancel()
    assert results["short"][-1] == Completed(prompt_tokens=1, completion_tokens=2)


async def test_the_loops_engine_calls_check_that_no_step_is_in_flight(nursery):
    """add_request(), the loop's handle reads and its engine-state reads are only safe
    between steps: each checks it, so a call made during a step fails loudly instead of
    racing the engine."""
    engine = await start_scheduler(nursery, gil_free=True)
    pipeline, scheduler = engine.pipeline, engine.scheduler
    async with trio.open_nursery() as requests:
        requests.start_soon(received, scheduler, request(1000))
        gate = pipeline.gate = Gate()
        while not gate.reached.is_set():
            await trio.sleep(0.001)
        calls = {
            "add_request": lambda: scheduler._admission._add_request(None, None, 0),
            "reading the handles": scheduler._read_between_steps,
            "reading the engine's state": scheduler._read_engine_state,
        }
        for what, call in calls.items():
            with pytest.raises(AssertionError, match=f"{what} while an engine step is in flight"):
                call()
        pipeline.gate = None
        gate.set()
        requests.cancel_scope.cancel()
