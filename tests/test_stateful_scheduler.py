"""The one-at-a-time scheduler of the stateful backend (ovtrio/scheduler/stateful.py),
on a fake LLMPipeline: what the real engine cannot be made to do on demand (fail), and
the paths a request can take to its end, observed through the scheduler's public side."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from fake_engine import received, request
from fake_stateful import start_stateful
from ovtrio.scheduler import AdmissionLimits, Completed, Delta, Failed, NotAccepting, Overloaded, UnsupportedParams


@pytest.fixture
async def engine(nursery):
    return await start_stateful(nursery)


def text_of(messages: list[Any]) -> str:
    return "".join(m.text for m in messages if isinstance(m, Delta))


async def test_a_request_runs_to_completion(engine):
    messages = await received(engine.scheduler, request(3))
    assert text_of(messages) == "aba"
    assert [m for m in messages if isinstance(m, Delta)][-1].finish_reason == "length"
    assert messages[-1] == Completed(prompt_tokens=1, completion_tokens=3)
    assert engine.observed.ends == ["length 1+3"]
    assert len(engine.observed.queued_seconds) == 1 and engine.observed.first_tokens == 1
    stats = engine.scheduler.stats()
    assert (stats.running, stats.engine_requests, stats.generated_tokens, stats.kv_cache_usage) == (0, 0, 3, 0.0)


async def test_a_failed_generation_fails_its_request_and_the_next_is_served(engine):
    engine.pipeline.failing = 1
    messages = await received(engine.scheduler, request(4))
    assert isinstance(messages[-1], Failed)
    assert messages[-1].code == "engine_error" and "boom" in messages[-1].message
    after = await received(engine.scheduler, request(2))
    assert after[-1] == Completed(prompt_tokens=1, completion_tokens=2)
    assert engine.observed.ends == ["error", "length 1+2"]
    assert engine.scheduler.in_flight == 0


async def test_a_stop_string_cuts_the_text_and_cancels_the_generation(engine):
    messages = await received(engine.scheduler, request(1000, stop=("ba",)))
    assert text_of(messages) == "a"
    assert [m for m in messages if isinstance(m, Delta)][-1].finish_reason == "stop"
    # The tokens read with the stop string's count (as many as arrived in one read).
    assert isinstance(messages[-1], Completed) and messages[-1].completion_tokens >= 2
    with trio.fail_after(5):
        while engine.scheduler.stats().engine_requests:
            await trio.sleep(0.01)
    assert engine.pipeline.cancelled == 1 and engine.pipeline.written[0] < 1000


async def test_a_consumer_that_leaves_cancels_the_generation(engine):
    async with engine.scheduler.submit(request(100_000)) as stream:
        assert await stream.receive_available()
    assert engine.observed.ends == ["abort"]
    with trio.fail_after(5):
        assert (await received(engine.scheduler, request(1)))[-1] == Completed(prompt_tokens=1, completion_tokens=1)
    assert engine.pipeline.cancelled == 1 and engine.pipeline.written[0] < 100_000


async def test_requests_run_one_at_a_time_in_arrival_order(engine):
    order: list[str] = []

    async def run(name: str, tokens: int, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        messages = await received(engine.scheduler, request(tokens))
        assert messages[-1] == Completed(prompt_tokens=1, completion_tokens=tokens)
        order.append(name)

    async with trio.open_nursery() as nursery:
        for name in ("first", "second", "third"):
            await nursery.start(run, name, 50)
            await trio.sleep(0.01)
    assert order == ["first", "second", "third"]
    assert engine.pipeline.most_inside == 1 and engine.pipeline.calls == 3


async def test_a_full_queue_refuses_with_overloaded(nursery):
    engine = await start_stateful(nursery, AdmissionLimits(max_running_sequences=1, max_queued_requests=1))
    async with engine.scheduler.submit(request(100_000)) as running:
        assert await running.receive_available()
        async with trio.open_nursery() as waiting:
            waiting.start_soon(received, engine.scheduler, request(1))
            while engine.scheduler.stats().queued == 0:
                await trio.sleep(0.005)
            with pytest.raises(Overloaded):
                engine.scheduler.check_capacity()
            assert engine.scheduler.stats().rejected == 1
            waiting.cancel_scope.cancel()  # its client leaves: it leaves the queue
        assert engine.scheduler.stats().queued == 0
    assert engine.scheduler.in_flight == 0


async def test_a_reader_that_stops_reading_pauses_the_generation_then_is_cancelled(nursery):
    engine = await start_stateful(
        nursery,
        AdmissionLimits(max_running_sequences=1, slow_reader_buffer=4, slow_reader_timeout=0.3),
        buffered_tokens=8,
        seconds_per_token=0.0,
    )
    async with engine.scheduler.submit(request(100_000)) as stream:
        with trio.fail_after(10):
            while engine.scheduler.in_flight:  # read nothing until the timeout ends it
                await trio.sleep(0.05)
        messages: list[Any] = []
        while batch := await stream.receive_available():
            messages += batch
    assert messages[-1].code == "slow_reader_timeout"
    assert engine.scheduler.stats().slow_readers_cancelled == 1
    # The engine waited for the reader: a few buffers' worth, not the 100,000 tokens.
    with trio.fail_after(5):
        while not engine.pipeline.written:
            await trio.sleep(0.01)
    assert engine.pipeline.written[0] < 100


async def test_a_draining_scheduler_refuses_new_requests_and_finishes_those_in_flight(engine):
    async with engine.scheduler.submit(request(20)) as stream:
        engine.scheduler.drain()
        with pytest.raises(NotAccepting):
            async with engine.scheduler.submit(request(1)):
                pass
        messages: list[Any] = []
        while batch := await stream.receive_available():
            messages += batch
    assert messages[-1] == Completed(prompt_tokens=1, completion_tokens=20)
    with trio.fail_after(5):
        await engine.scheduler.idle()


async def test_fail_all_ends_the_running_and_the_queued_requests(engine):
    results: dict[str, list[Any]] = {}

    async def queued() -> None:
        results["queued"] = await received(engine.scheduler, request(5))

    async with engine.scheduler.submit(request(100_000)) as stream:
        assert await stream.receive_available()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(queued)
            while engine.scheduler.stats().queued == 0:
                await trio.sleep(0.005)
            assert engine.scheduler.fail_all("stopping") == 2
        rest: list[Any] = []
        while batch := await stream.receive_available():
            rest += batch
    assert rest[-1] == Failed("stopping", "shutting_down")
    assert results["queued"] == [Failed("stopping", "shutting_down")]
    assert engine.scheduler.in_flight == 0
    with trio.fail_after(5):
        while engine.scheduler.stats().engine_requests:
            await trio.sleep(0.01)
    assert engine.pipeline.cancelled == 1


async def test_stopping_the_loop_fails_what_runs_and_waits_for_the_engine(engine):
    async with engine.scheduler.submit(request(100_000)) as stream:
        assert await stream.receive_available()
        engine.stop()
        rest: list[Any] = []
        while batch := await stream.receive_available():
            rest += batch
    assert rest[-1] == Failed("server is shutting down", "shutting_down")
    with pytest.raises(NotAccepting):
        async with engine.scheduler.submit(request(1)):
            pass
    with trio.fail_after(5):
        while engine.pipeline.inside:
            await trio.sleep(0.01)
    assert engine.pipeline.cancelled == 1


async def test_a_request_whose_settings_the_engine_refuses_does_not_hold_the_drain(engine, monkeypatch):
    from ovtrio.scheduler import stateful

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("the engine refuses these settings")

    outcome: list[str] = []
    drained = trio.Event()

    async def refused_request() -> None:
        with pytest.raises(UnsupportedParams):
            await received(engine.scheduler, request(3))
        outcome.append("refused")

    async def wait_for_idle() -> None:
        await engine.scheduler.idle()
        drained.set()

    async with trio.open_nursery() as nursery:
        async with engine.scheduler.submit(request(100_000)) as running:
            assert await running.receive_available()
            monkeypatch.setattr(stateful, "to_generation_config", refuse)
            nursery.start_soon(refused_request)
            while engine.scheduler.stats().queued == 0:
                await trio.sleep(0.005)
            engine.scheduler.drain()
            nursery.start_soon(wait_for_idle)
            await trio.sleep(0.01)
        # The running request ends here; the loop then takes up the refused one, the
        # last in flight, whose end must still tell the drain that nothing is left.
        with trio.fail_after(5):
            await drained.wait()
    assert outcome == ["refused"]
    assert engine.scheduler.in_flight == 0
