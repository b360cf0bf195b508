"""The scheduler's failure paths, which the real engine cannot be made to take on demand:
a step that raises, a request the engine drops (IGNORED: the KV cache ran out), and
shutdown with requests in flight (drained, cut, or both). Pure logic against a small fake pipeline; everything
is observed through the scheduler's public side (submit, run, stats, the messages a
request receives)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from fake_engine import DROPPED_PROMPT, VOCABULARY, received, request, start_scheduler
from ovtrio.scheduler import Completed, Delta, Failed, GenerationRequest, NotAccepting
from ovtrio.serving.shutdown import Shutdown


@pytest.fixture(params=[False, True], ids=["binding-step", "gil-free-runs"])
async def engine(nursery, request):
    return await start_scheduler(nursery, gil_free=request.param)


async def test_a_request_runs_to_completion(engine):
    messages = await received(engine.scheduler, request(3))
    deltas = [m for m in messages if isinstance(m, Delta)]
    assert "".join(d.text for d in deltas) == "aaa"
    assert deltas[-1].finish_reason == "length"
    assert messages[-1] == Completed(prompt_tokens=1, completion_tokens=3)
    assert engine.observed.ends == ["length 1+3"]


async def test_a_failed_step_fails_its_batch_and_the_loop_goes_on(engine):
    engine.pipeline.failing_steps = 1
    messages = await received(engine.scheduler, request(4))
    assert isinstance(messages[-1], Failed)
    assert messages[-1].code == "engine_error" and "boom" in messages[-1].message
    assert engine.pipeline.handles[0].cancelled
    # The next request is served as if nothing happened.
    after = await received(engine.scheduler, request(2))
    assert after[-1] == Completed(prompt_tokens=1, completion_tokens=2)
    assert engine.scheduler.stats().running == 0
    assert engine.observed.ends == ["error", "length 1+2"]


class FailingDecoder:
    """A detokenizer that raises on its next `failures` calls, then decodes the fake's
    vocabulary."""

    def __init__(self) -> None:
        self.failures = 0

    def decode(self, batch: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("cannot decode")
        return [bytes(b"".join(VOCABULARY.token_bytes[i] for i in row)).decode() for row in batch]


@pytest.mark.parametrize("gil_free", [False, True], ids=["binding-step", "gil-free-runs"])
async def test_a_detokenizer_that_raises_fails_its_requests_and_the_loop_goes_on(nursery, gil_free):
    decoder = FailingDecoder()
    engine = await start_scheduler(nursery, gil_free=gil_free, tokenizer=decoder)
    decoder.failures = 1
    messages = await received(engine.scheduler, request(4))
    assert isinstance(messages[-1], Failed)
    assert messages[-1].code == "engine_error" and "cannot decode" in messages[-1].message
    after = await received(engine.scheduler, request(3))
    assert "".join(m.text for m in after if isinstance(m, Delta)) == "aaa"
    assert after[-1] == Completed(prompt_tokens=1, completion_tokens=3)
    assert engine.scheduler.stats().running == 0


async def test_a_request_the_engine_drops_fails_alone(engine):
    results: dict[str, list[Any]] = {}

    async def run(name: str, generation: GenerationRequest) -> None:
        results[name] = await received(engine.scheduler, generation)

    async with trio.open_nursery() as requests:
        requests.start_soon(run, "kept", request(5))
        requests.start_soon(run, "dropped", request(5, DROPPED_PROMPT))
    assert results["dropped"] == [Failed(results["dropped"][-1].message, "out_of_memory")]
    assert "KV cache" in results["dropped"][-1].message
    assert results["kept"][-1] == Completed(prompt_tokens=1, completion_tokens=5)
    assert engine.scheduler.stats().running == 0
    assert sorted(engine.observed.ends) == ["error", "length 1+5"]


async def test_shutdown_fails_the_requests_in_flight(engine):
    async with engine.scheduler.submit(request(1000)) as stream:
        first = await stream.receive_available()
        assert isinstance(first[0], Delta)
        engine.stop()
        rest: list[Any] = []
        while batch := await stream.receive_available():
            rest += batch
    assert rest[-1] == Failed("server is shutting down", "shutting_down")
    assert engine.observed.ends == ["error"]
    assert engine.pipeline.handles[0].cancelled
    assert engine.scheduler.stats().running == 0
    with pytest.raises(RuntimeError):
        async with engine.scheduler.submit(request(1)):
            pass


async def test_a_consumer_that_leaves_cancels_its_engine_request(engine):
    async with engine.scheduler.submit(request(1000)) as stream:
        assert await stream.receive_available()
    assert engine.pipeline.handles[0].cancelled
    assert engine.scheduler.stats().running == 0
    assert engine.observed.ends == ["abort"] and engine.observed.first_tokens == 1
    # The engine is not stepped for it any more: a new request still completes.
    assert (await received(engine.scheduler, request(1)))[-1] == Completed(prompt_tokens=1, completion_tokens=1)


async def test_a_draining_scheduler_refuses_new_requests_and_finishes_those_in_flight(engine):
    async with engine.scheduler.submit(request(20)) as stream:
        engine.scheduler.drain()
        with pytest.raises(NotAccepting):
            async with engine.scheduler.submit(request(1)):
                pass
        assert engine.scheduler.in_flight == 1
        messages: list[Any] = []
        while batch := await stream.receive_available():
            messages += batch
    assert messages[-1] == Completed(prompt_tokens=1, completion_tokens=20)
    with trio.fail_after(5):
        await engine.scheduler.idle()
    assert engine.scheduler.in_flight == 0


async def test_fail_all_ends_what_still_runs_with_the_reason_given(engine):
    async with engine.scheduler.submit(request(1000)) as stream:
        assert await stream.receive_available()
        assert engine.scheduler.fail_all("stopping") == 1
        rest: list[Any] = []
        while batch := await stream.receive_available():
            rest += batch
    assert rest[-1] == Failed("stopping", "shutting_down")
    assert engine.pipeline.handles[0].cancelled
    assert engine.scheduler.in_flight == 0


async def collect(
    results: dict[str, list[Any]],
    name: str,
    scheduler: Any,
    tokens: int,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Submit a request of `tokens` tokens, say so once it is in, and gather its messages
    into results[name]."""
    async with scheduler.submit(request(tokens)) as stream:
        task_status.started()
        results[name] = []
        while batch := await stream.receive_available():
            results[name] += batch


async def test_the_drain_waits_for_short_requests_and_cuts_long_ones(engine):
    """ovtrio/serving/shutdown.py against the scheduler: what ends within the timeout ends
    normally, the rest is failed when it passes (or when hurried), and the state says
    draining from the start and drained at the end."""
    results: dict[str, list[Any]] = {}
    shutdown = Shutdown(drain_timeout=60)
    async with trio.open_nursery() as nursery:
        await nursery.start(collect, results, "short", engine.scheduler, 5)
        await nursery.start(collect, results, "long", engine.scheduler, 100_000)
        nursery.start_soon(shutdown.drain, [engine.scheduler], "test")
        await trio.testing.wait_all_tasks_blocked()
        assert shutdown.draining.is_set() and not shutdown.drained.is_set()
        while "short" not in results or not isinstance(results["short"][-1], Completed):
            await trio.sleep(0.01)
        shutdown.hurry()  # a second signal: no need to wait the 60 s
        with trio.fail_after(5):
            await shutdown.drained.wait()
    assert results["long"][-1] == Failed("the server is shutting down", "shutting_down")
    assert engine.scheduler.in_flight == 0


async def test_one_drain_covers_the_schedulers_of_every_model(nursery):
    """Several models: the drain refuses new work on each, waits for the requests of all
    of them, and cuts what still runs on any when it is hurried."""
    first, second = await start_scheduler(nursery), await start_scheduler(nursery)
    results: dict[str, list[Any]] = {}
    shutdown = Shutdown(drain_timeout=60)
    async with trio.open_nursery() as requests:
        await requests.start(collect, results, "first", first.scheduler, 5)
        await requests.start(collect, results, "second", second.scheduler, 100_000)
        requests.start_soon(shutdown.drain, [first.scheduler, second.scheduler], "test")
        await trio.testing.wait_all_tasks_blocked()
        for engine in (first, second):
            with pytest.raises(NotAccepting):
                async with engine.scheduler.submit(request(1)):
                    pass
        while not (results.get("first") and isinstance(results["first"][-1], Completed)):
            await trio.sleep(0.01)
        assert not shutdown.drained.is_set()  # the second model still has a request
        shutdown.hurry()
        with trio.fail_after(5):
            await shutdown.drained.wait()
    assert results["second"][-1] == Failed("the server is shutting down", "shutting_down")
    assert first.scheduler.in_flight == second.scheduler.in_flight == 0
