"""Admission and slow readers in the scheduler, as pure logic against the fake pipeline:
the queue bound and its refusals, the times the observer is told, a consumer that stops
reading (paused, then cancelled) and one that catches up (nothing lost); and the
defaults the server derives from the KV cache."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from fake_engine import received, request, start_scheduler
from ovtrio.constraints.check import CheckerBusy
from ovtrio.loading.limits import request_caps, work_limits
from ovtrio.scheduler import AdmissionLimits, Completed, Delta, Failed, NotAccepting, OutputConstraint, Overloaded
from ovtrio.settings.server import Settings


@pytest.fixture(params=[False, True], ids=["binding-step", "gil-free-runs"])
def gil_free(request) -> bool:
    """Each test runs with both ways the scheduler steps the engine."""
    return request.param


async def wait_until(condition: Any, within: float = 120) -> None:
    # `within` bounds a hang only: a loaded machine's steps may be slow.
    with trio.fail_after(within):
        while not condition():
            await trio.sleep(0.005)


async def test_requests_beyond_running_and_queued_are_refused(nursery, gil_free):
    engine = await start_scheduler(
        nursery, AdmissionLimits(max_running_sequences=1, max_queued_requests=1), gil_free=gil_free
    )
    scheduler = engine.scheduler
    results: dict[str, list[Any]] = {}

    async def run(name: str, max_new_tokens: int) -> None:
        results[name] = await received(scheduler, request(max_new_tokens))

    nursery.start_soon(run, "running", 10_000)
    await wait_until(lambda: scheduler.stats().running == 1)
    nursery.start_soon(run, "queued", 3)
    await wait_until(lambda: scheduler.stats().queued == 1)

    with pytest.raises(Overloaded) as refused:
        scheduler.check_capacity()
    assert refused.value.retry_after >= 1
    with pytest.raises(Overloaded):
        async with scheduler.submit(request(1)):
            pass
    stats = scheduler.stats()
    assert (stats.running, stats.queued, stats.running_sequences, stats.rejected) == (1, 1, 1, 2)
    assert stats.waiting >= 1  # as vLLM counts it, the queued request waits too
    assert len(engine.pipeline.handles) == 1  # the queued request is not in the engine

    # The running request ends (its consumer leaves): the queued one starts and completes.
    engine.pipeline.handles[0].left = 1
    await wait_until(lambda: "queued" in results)
    assert results["queued"][-1] == Completed(prompt_tokens=1, completion_tokens=3)
    stats = scheduler.stats()
    assert (stats.running, stats.queued, stats.running_sequences) == (0, 0, 0)

    # Both were added to the engine: the first at once, the queued one after the wait.
    observed = engine.observed
    assert len(observed.queued_seconds) == 2 and len(observed.first_token_seconds) == 2
    waited = max(observed.queued_seconds)
    assert 0 < waited <= max(observed.first_token_seconds)
    assert len(observed.ends) == 2 and observed.ends[-1] == "length 1+3"


async def test_a_consumer_leaving_the_queue_frees_its_place(nursery, gil_free):
    engine = await start_scheduler(
        nursery, AdmissionLimits(max_running_sequences=1, max_queued_requests=1), gil_free=gil_free
    )
    scheduler = engine.scheduler
    async with scheduler.submit(request(10_000)) as stream:
        assert await stream.receive_available()
        with trio.move_on_after(0.05):
            async with scheduler.submit(request(1)):
                pass
        assert scheduler.stats().queued == 0
        # It never reached the engine: nothing is reported of it.
        assert len(engine.observed.queued_seconds) == 1 and engine.observed.ends == []
    assert scheduler.stats().running == 0


async def test_a_request_larger_than_the_running_limit_runs_alone(nursery, gil_free):
    engine = await start_scheduler(
        nursery, AdmissionLimits(max_running_sequences=2, max_queued_requests=1), gil_free=gil_free
    )
    messages = await received(engine.scheduler, request(2, n=3, temperature=1.0))
    assert messages[-1] == Completed(prompt_tokens=1, completion_tokens=6)


async def test_a_consumer_that_stops_reading_is_paused_then_cancelled(nursery, gil_free):
    limits = AdmissionLimits(slow_reader_buffer=4, slow_reader_timeout=1.0)
    engine = await start_scheduler(nursery, limits, gil_free=gil_free)
    scheduler = engine.scheduler
    async with scheduler.submit(request(100_000)) as stream:
        await wait_until(lambda: scheduler.stats().paused == 1)
        handle = engine.pipeline.handles[0]
        # Paused: the engine's output waits in the handle, not in the channel.
        await wait_until(lambda: len(handle.unread) > 0)
        await wait_until(lambda: scheduler.stats().running == 0)
        messages: list[Any] = []
        while batch := await stream.receive_available():
            messages += batch
    assert handle.cancelled
    deltas = [m for m in messages if isinstance(m, Delta)]
    assert limits.slow_reader_buffer <= len(deltas) <= limits.slow_reader_buffer + 2
    assert messages[-1] == Failed(messages[-1].message, "slow_reader_timeout")
    stats = scheduler.stats()
    assert (stats.paused, stats.slow_readers_cancelled, stats.running_sequences) == (0, 1, 0)


async def test_a_paused_consumer_that_catches_up_loses_nothing(nursery, gil_free):
    engine = await start_scheduler(
        nursery, AdmissionLimits(slow_reader_buffer=4, slow_reader_timeout=60), gil_free=gil_free
    )
    scheduler = engine.scheduler
    tokens = 300
    async with scheduler.submit(request(tokens)) as stream:
        await wait_until(lambda: scheduler.stats().paused == 1)
        # The engine finishes the request while it is paused; the loop then sleeps.
        await wait_until(lambda: engine.pipeline.handles[0].left == 0)
        messages: list[Any] = []
        while batch := await stream.receive_available():
            messages += batch
    text = "".join(m.text for m in messages if isinstance(m, Delta))
    assert text == "a" * tokens
    assert messages[-1] == Completed(prompt_tokens=1, completion_tokens=tokens)
    assert scheduler.stats().slow_readers_cancelled == 0


def test_default_limits_come_from_the_kv_cache():
    source = SimpleNamespace(context_length=8192, path=Path("m.gguf"))
    defaults = Settings()
    work = work_limits(defaults, kv_capacity=78_464)
    assert (work.running_sequences, work.queued_requests) == (76, 152)  # 1024 tokens each, twice as many waiting
    caps = request_caps(defaults, source, 78_464, work)
    assert (caps.prompts, caps.choices, caps.prompt_tokens) == (64, 64, 78_464)
    # A small cache: the running limit, and with it the choices, shrink to what it holds.
    small = work_limits(defaults, kv_capacity=256)
    assert (small.running_sequences, small.queued_requests) == (1, 2)
    assert request_caps(defaults, source, 256, small).choices == 1
    # max_num_seqs bounds it too; explicit settings win.
    assert work_limits(Settings(max_num_seqs=8), kv_capacity=78_464).running_sequences == 8
    explicit = Settings(max_running_sequences=3, max_queued_requests=0, max_choices_per_request=5)
    work = work_limits(explicit, kv_capacity=78_464)
    assert (work.running_sequences, work.queued_requests) == (3, 0)
    assert request_caps(explicit, source, 78_464, work).choices == 5


async def test_scoring_takes_running_places_in_the_same_queue(nursery, gil_free):
    """A scoring request (scheduler.reserve) waits for room like a generation, holds its
    places while it runs (a generation submitted meanwhile waits), and gives them back."""
    engine = await start_scheduler(
        nursery, AdmissionLimits(max_running_sequences=2, max_queued_requests=4), gil_free=gil_free
    )
    scheduler = engine.scheduler
    events: list[str] = []
    release = trio.Event()

    async def generate(name: str, max_new_tokens: int) -> None:
        await received(scheduler, request(max_new_tokens))
        events.append(name)

    async def score() -> None:
        async with scheduler.reserve(2):
            events.append("scoring admitted")
            await release.wait()
        events.append("scoring done")

    nursery.start_soon(generate, "long", 10_000)
    await wait_until(lambda: scheduler.stats().running == 1)
    nursery.start_soon(score)
    await wait_until(lambda: scheduler.stats().queued == 1)
    assert events == []  # two places asked for, one free: it waits
    engine.pipeline.handles[0].left = 1  # the long generation ends
    await wait_until(lambda: events == ["long", "scoring admitted"])
    assert scheduler.stats().running_sequences == 2
    nursery.start_soon(generate, "after", 2)
    await wait_until(lambda: scheduler.stats().queued == 1)
    assert len(engine.pipeline.handles) == 1  # the new generation waits for the scoring's places
    release.set()
    await wait_until(lambda: events == ["long", "scoring admitted", "scoring done", "after"])
    assert scheduler.stats().running_sequences == 0


class SlowChecker:
    """Stands in for the grammar checker: each constraint is compiled when `done` is set."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.waiting = 0

    async def grammar(self, request: dict[str, Any]) -> str:
        self.waiting += 1
        await self.done.wait()
        return 'root ::= "true"'

    def close(self) -> None:
        pass


async def test_requests_waiting_for_their_constraint_check_count_toward_the_queue(nursery):
    engine = await start_scheduler(nursery, AdmissionLimits(max_running_sequences=1, max_queued_requests=1))
    scheduler = engine.scheduler
    scheduler._admission._grammars = checker = SlowChecker()
    results: dict[str, list[Any]] = {}

    async def run(name: str) -> None:
        constrained = request(3, constraint=OutputConstraint(json_schema=f'{{"title": "{name}"}}'))
        results[name] = await received(scheduler, constrained)

    nursery.start_soon(run, "first")
    nursery.start_soon(run, "second")
    await wait_until(lambda: checker.waiting == 2)
    # One place in the engine, one in the queue: both taken by requests being checked.
    with pytest.raises(Overloaded, match="2 requests are waiting"):
        scheduler.check_capacity()
    with trio.fail_after(5), pytest.raises(Overloaded):
        async with scheduler.submit(request(1, constraint=OutputConstraint(json_schema='{"title": "third"}'))):
            pass
    assert checker.waiting == 2  # refused before its check

    checker.done.set()  # both are served
    await wait_until(lambda: len(results) == 2)
    assert results["first"][-1] == results["second"][-1] == Completed(prompt_tokens=1, completion_tokens=3)


async def test_a_constraint_check_after_the_checker_closed_is_told_the_server_is_stopping(nursery):
    engine = await start_scheduler(nursery)
    scheduler = engine.scheduler
    scheduler._admission._grammars.close()  # as the loop's end closes it
    with pytest.raises(NotAccepting):
        await scheduler.checked(request(1, constraint=OutputConstraint(json_schema='{"type": "boolean"}')))


class BusyChecker(SlowChecker):
    """Stands in for a grammar checker the machine kept from compiling (CheckerBusy)."""

    async def grammar(self, request: dict[str, Any]) -> str:
        raise CheckerBusy("the server was too busy to compile it within 5 s; it may be sent again")


async def test_a_constraint_the_machine_kept_from_being_checked_is_an_overload_to_retry(nursery):
    engine = await start_scheduler(nursery)
    scheduler = engine.scheduler
    scheduler._admission._grammars = BusyChecker()
    with pytest.raises(Overloaded, match="could not check the output format") as refused:
        await scheduler.checked(request(1, constraint=OutputConstraint(json_schema='{"type": "boolean"}')))
    assert refused.value.retry_after >= 1
