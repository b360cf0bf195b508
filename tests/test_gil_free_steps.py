"""Every engine step is the GIL-free one when it is available, a request's first step
included (stepping.py): what could throw in a first step is made impossible before
admission instead. Its output constraint is compiled first (constraints/check.py,
with the real XGrammar) and reaches the engine as the grammar that compiled; one that
does not compile is refused before the engine sees it. Pure logic against the fake
pipeline, which records which route each step took.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from fake_engine import VOCABULARY, FakePipeline, Observed, received, request
from ovtrio.scheduler import Completed, OutputConstraint, Scheduler, UnsupportedParams
from ovtrio.scheduler.engine_step import EngineStep
from ovtrio.scheduler.stepping import Stepping, choose_stepping

SCHEMA = OutputConstraint(json_schema='{"type": "object"}', param="response_format")
# XGrammar cannot build a grammar for an empty enum (the engine's step would throw).
UNCOMPILABLE = OutputConstraint(json_schema='{"enum": []}', param="text.format")


class RoutedPipeline(FakePipeline):
    """A fake pipeline whose steps say which route they came by: each handle keeps the
    routes of the steps that made its tokens, and the configs it was added with are
    kept."""

    def __init__(self) -> None:
        super().__init__()
        self.configs: list[Any] = []

    def add_request(self, request_id: int, prompt: Any, *images_and_config: Any) -> Any:
        self.configs.append(images_and_config[-1])
        return super().add_request(request_id, prompt, *images_and_config)

    def step(self) -> None:  # the binding's step()
        self._step("binding")

    def gil_free_step(self) -> None:
        time.sleep(0.001)  # lets other threads run, as the real GIL-free step does
        self._step("gil-free")

    def _step(self, route: str) -> None:
        running = self._running()
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


async def test_new_sampling_settings_step_gil_free_from_their_first_step(nursery):
    engine = await start(nursery)
    assert await routes_of(engine, 3) == ["gil-free"] * 3
    assert await routes_of(engine, 3, logprobs=True) == ["gil-free"] * 3
    assert await routes_of(engine, 3, repetition_penalty=1.2) == ["gil-free"] * 3
    assert await routes_of(engine, 2, temperature=0.7, top_k=5, seed=1) == ["gil-free"] * 2


async def test_a_constrained_request_steps_gil_free_with_the_grammar_compiled_before(nursery):
    engine = await start(nursery)
    assert await routes_of(engine, 4, constraint=SCHEMA) == ["gil-free"] * 4
    config = engine.pipeline.configs[-1].structured_output_config
    # The engine is given the grammar that compiled, not the schema to compile itself.
    assert config.json_schema is None and config.grammar is not None and "root ::=" in config.grammar


async def test_a_constraint_that_does_not_compile_is_refused_before_the_engine_sees_it(nursery):
    engine = await start(nursery)
    with pytest.raises(UnsupportedParams) as refused:
        await received(engine.scheduler, request(4, constraint=UNCOMPILABLE))
    assert refused.value.param == "text.format"
    assert engine.pipeline.configs == []  # no add_request
    assert await routes_of(engine, 2, constraint=SCHEMA) == ["gil-free"] * 2


async def test_without_a_gil_free_step_every_step_is_the_bindings(nursery):
    engine = await start(nursery, gil_free=False)
    assert await routes_of(engine, 3, constraint=SCHEMA) == ["binding"] * 3


def test_the_choice_of_stepping():
    assert choose_stepping(gil_free=True, runs=True) is Stepping.RUNS
    assert choose_stepping(gil_free=True, runs=False) is Stepping.ONE_STEP
    assert choose_stepping(gil_free=False, runs=True) is Stepping.WHEN_IDLE
