"""Which steps go through the binding's step instead of the GIL-free one (stepping.py).

An exception inside the GIL-free (ctypes) step would end the process; the binding's
raises it as RuntimeError, which fails the batch and lets the server go on. The first
step of an engine request whose settings or output constraint were never stepped
before is the one a request can make throw, so it goes through the binding. Pure logic
against the fake pipeline, which records which route each step took.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import openvino_genai
import pytest
import trio

from fake_engine import VOCABULARY, FakePipeline, Observed, received, request
from ovtrio.scheduler import Completed, Failed, OutputConstraint, SamplingParams, Scheduler
from ovtrio.scheduler.engine_step import EngineStep
from ovtrio.scheduler.requests import EngineRequest
from ovtrio.scheduler.stepping import FirstSteps, Stepping, choose_stepping

SCHEMA = OutputConstraint(json_schema='{"type": "object"}')
OTHER_SCHEMA = OutputConstraint(json_schema='{"type": "array"}')


class RoutedPipeline(FakePipeline):
    """A fake pipeline whose steps say which route they came by: each handle keeps the
    routes of the steps that made its tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.binding_steps = 0
        self.terminated = False
        # Throw in the first step of a request, as the engine does for a grammar it
        # cannot compile.
        self.throw_at_first_steps = False

    def step(self) -> None:  # the binding's step()
        self.binding_steps += 1
        self._step("binding")

    def gil_free_step(self) -> None:
        time.sleep(0.001)  # lets other threads run, as the real GIL-free step does
        try:
            self._step("gil-free")
        except Exception:
            self.terminated = True  # what the engine's exception would do to the process
            raise

    def _step(self, route: str) -> None:
        running = self._running()
        if self.throw_at_first_steps and any(h.added_after_step == self.steps for h in running):
            self.steps += 1
            raise RuntimeError("boom")
        super().step()
        for handle in running:
            handle.routes = [*getattr(handle, "routes", []), route]


async def start(nursery: trio.Nursery, gil_free: bool = True) -> SimpleNamespace:
    pipeline = RoutedPipeline()
    step = EngineStep(pipeline.gil_free_step, releases_gil=True, description="fake GIL-free") if gil_free else None
    scheduler = Scheduler(pipeline, None, VOCABULARY, step=step, observer=Observed())
    await nursery.start(scheduler.run)
    while scheduler.stats().steps_started == 0 or scheduler.stats().step_in_flight:
        await trio.sleep(0.005)
    return SimpleNamespace(pipeline=pipeline, scheduler=scheduler)


async def routes_of(engine: SimpleNamespace, max_new_tokens: int, **params: Any) -> list[str]:
    """The routes of the steps that ran one request, from its first step to its last."""
    messages = await received(engine.scheduler, request(max_new_tokens, **params))
    assert messages[-1] == Completed(prompt_tokens=1, completion_tokens=max_new_tokens)
    return engine.pipeline.handles[-1].routes


async def test_a_constrained_request_has_its_first_step_through_the_binding(nursery):
    engine = await start(nursery)
    assert await routes_of(engine, 4, constraint=SCHEMA) == ["binding"] + ["gil-free"] * 3
    # The same constraint and settings compiled and stepped without a fault: GIL-free.
    assert await routes_of(engine, 4, constraint=SCHEMA) == ["gil-free"] * 4
    # Another constraint compiles another grammar: its first step is the binding's again.
    assert await routes_of(engine, 3, constraint=OTHER_SCHEMA) == ["binding", "gil-free", "gil-free"]


async def test_new_sampling_settings_have_their_first_step_through_the_binding(nursery):
    engine = await start(nursery)
    assert await routes_of(engine, 3) == ["binding", "gil-free", "gil-free"]  # nothing was stepped before
    assert await routes_of(engine, 3) == ["gil-free"] * 3
    assert await routes_of(engine, 3, logprobs=True) == ["binding", "gil-free", "gil-free"]
    assert await routes_of(engine, 3, repetition_penalty=1.2) == ["binding", "gil-free", "gil-free"]
    assert await routes_of(engine, 3, repetition_penalty=1.3) == ["gil-free"] * 3  # the same code path


async def test_a_first_step_that_throws_fails_the_batch_and_the_server_goes_on(nursery):
    engine = await start(nursery)
    await routes_of(engine, 2)  # the plain settings are proven
    engine.pipeline.throw_at_first_steps = True
    binding_steps = engine.pipeline.binding_steps
    messages = await received(engine.scheduler, request(4, constraint=SCHEMA))
    # The binding's step raised as RuntimeError: the batch failed, the process lives.
    assert messages[-1] == Failed("engine error: boom", "engine_error")
    assert engine.pipeline.binding_steps > binding_steps and not engine.pipeline.terminated
    # Nothing was proven by the failed step: the next such request goes the same way.
    engine.pipeline.throw_at_first_steps = False
    assert await routes_of(engine, 2, constraint=SCHEMA) == ["binding", "gil-free"]
    assert await routes_of(engine, 2) == ["gil-free"] * 2


async def test_without_a_gil_free_step_every_step_is_the_bindings(nursery):
    engine = await start(nursery, gil_free=False)
    assert await routes_of(engine, 3, constraint=SCHEMA) == ["binding"] * 3


def test_the_choice_of_stepping():
    assert choose_stepping(gil_free=True, first_step_due=False, runs=True) is Stepping.RUNS
    assert choose_stepping(gil_free=True, first_step_due=False, runs=False) is Stepping.ONE_STEP
    assert choose_stepping(gil_free=True, first_step_due=True, runs=True) is Stepping.WHEN_IDLE
    assert choose_stepping(gil_free=False, first_step_due=False, runs=True) is Stepping.WHEN_IDLE


class StubHandle:
    def __init__(self) -> None:
        self.output = False
        self.status = openvino_genai.GenerationStatus.RUNNING

    def can_read(self) -> bool:
        return self.output

    def get_status(self) -> Any:
        return self.status


RUNNING = openvino_genai.GenerationStatus.RUNNING


@pytest.mark.parametrize("ends", ["output", "dropped", "stopped"])
def test_a_first_step_is_due_until_the_engine_request_had_it(ends):
    """Due while the engine has not scheduled it (no output yet, still running): a
    request that waits for room in the engine has its first step later. Its settings
    are proven only by output."""
    first_steps = FirstSteps()
    params = SamplingParams(max_new_tokens=4, temperature=0.0, constraint=SCHEMA)
    handle = StubHandle()
    part = first_steps.added(EngineRequest(handle, []), params)
    first_steps.stepped(RUNNING)
    assert first_steps.due  # not scheduled in that step
    if ends == "output":
        handle.output = True
    elif ends == "dropped":
        part.handle = None  # its request ended before its first step
    else:
        handle.status = openvino_genai.GenerationStatus.IGNORED
    first_steps.stepped(RUNNING)
    assert not first_steps.due
    first_steps.added(EngineRequest(StubHandle(), []), params)
    assert first_steps.due == (ends != "output")
