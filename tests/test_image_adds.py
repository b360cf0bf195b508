"""A vision-language model's engine decodes and encodes a request's images inside
add_request (with the GIL released): the scheduler makes those calls in a worker thread,
between steps, so the event loop serves other requests meanwhile. Pure logic, on the
fake pipeline (tests/fake_engine.py)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import trio

from fake_engine import REFUSED_TEXT, received, start_scheduler
from ovtrio.scheduler import Completed, GenerationRequest, SamplingParams, UnsupportedParams
from ovtrio.scheduler.params import TextPrompt

IMAGE = np.zeros((4, 4, 3), dtype=np.uint8)


def image_request(text: str = "<ov_genai_image_0> what is this?", n: int = 1) -> GenerationRequest:
    params = SamplingParams(max_new_tokens=3, temperature=0.0 if n == 1 else 1.0, n=n)
    return GenerationRequest([[1, 1, 1]], params, texts=[TextPrompt(text, (IMAGE,))])


@pytest.fixture
async def engine(nursery):
    scheduler = await start_scheduler(nursery)
    yield scheduler
    scheduler.stop()


async def test_image_requests_are_added_from_a_worker_thread_while_the_loop_runs_on(engine):
    pipeline = engine.pipeline
    pipeline.add_gate = threading.Event()
    result: list = []
    ticks = 0

    async def submit() -> None:
        result.extend(await received(engine.scheduler, image_request()))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit)
        with trio.fail_after(10):
            while not pipeline.adding.is_set():
                await trio.sleep(0.001)
        # The add is held in the engine: the event loop still runs other tasks.
        for _ in range(20):
            await trio.sleep(0.001)
            ticks += 1
        assert pipeline.add_threads and pipeline.add_threads[0] != threading.get_ident()
        pipeline.add_gate.set()
    assert ticks == 20
    assert result[-1] == Completed(prompt_tokens=3, completion_tokens=3)


async def test_every_choice_of_an_image_request_gets_its_engine_request(engine):
    messages = await received(engine.scheduler, image_request(n=3))
    assert len(engine.pipeline.add_threads) == 3
    assert messages[-1] == Completed(prompt_tokens=3, completion_tokens=9)


async def test_an_image_request_the_engine_refuses_fails_alone(engine):
    with pytest.raises(UnsupportedParams, match="refuses"):
        await received(engine.scheduler, image_request(REFUSED_TEXT + " <ov_genai_image_0>"))
    assert engine.scheduler.stats().running == 0
    messages = await received(engine.scheduler, image_request())
    assert messages[-1] == Completed(prompt_tokens=3, completion_tokens=3)


async def test_a_consumer_that_leaves_while_its_images_are_added_costs_no_engine_work(engine):
    pipeline = engine.pipeline
    pipeline.add_gate = threading.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(received, engine.scheduler, image_request())
        with trio.fail_after(10):
            while not pipeline.adding.is_set():
                await trio.sleep(0.001)
        nursery.cancel_scope.cancel()  # the client is gone while the engine adds
    pipeline.add_gate.set()
    with trio.fail_after(10):
        while engine.scheduler.in_flight or not pipeline.handles:
            await trio.sleep(0.001)
        while any(not handle.cancelled for handle in pipeline.handles):
            await trio.sleep(0.001)
    # The next request runs as usual.
    messages = await received(engine.scheduler, image_request())
    assert messages[-1] == Completed(prompt_tokens=3, completion_tokens=3)


async def test_every_submitter_goes_on_when_the_loop_ends_during_the_adds(engine):
    pipeline = engine.pipeline
    pipeline.add_gate = threading.Event()
    outcomes: list = []

    async def submit() -> None:
        try:
            outcomes.append((await received(engine.scheduler, image_request()))[-1])
        except Exception as exc:  # noqa: BLE001 - whatever it ends with, it must end
            outcomes.append(exc)

    async with trio.open_nursery() as nursery:
        # Both arrive before the loop's next pass: it takes them together.
        nursery.start_soon(submit)
        nursery.start_soon(submit)
        with trio.fail_after(10):
            while not pipeline.adding.is_set():
                await trio.sleep(0.001)
        engine.stop()  # the server shuts down while the engine adds the first one's images
        pipeline.add_gate.set()
        with trio.fail_after(10):
            while len(outcomes) < 2:
                await trio.sleep(0.001)
    assert not any(isinstance(outcome, Completed) for outcome in outcomes)
