"""Long prompts prefilled in slices (ovtrio/scheduler/prefill.py): which prefixes, in
which order against other requests, and what happens when a request ends while its
prompt is being prefilled. Pure logic against the fake pipeline (fake_engine.py), whose
handles keep the prompt they were added with."""

from __future__ import annotations

import threading

import pytest
import trio
from pydantic import ValidationError

from fake_engine import DROPPED_PROMPT, REFUSED_PROMPT, received, request, start_scheduler
from ovtrio.loading.limits import prefill_itl_bound, prefill_slice_tokens
from ovtrio.scheduler import Completed, Delta, Failed, GenerationRequest, SamplingParams, UnsupportedParams
from ovtrio.scheduler.params import OutputConstraint, SpeculativeDecoding
from ovtrio.scheduler.prefill import SlicedPrefill, prefills_whole, slice_params
from ovtrio.scheduler.prefill_policy import slice_size
from ovtrio.settings.server import Settings

SLICE = 4
BLOCK = 2
LONG = list(range(100, 111))  # 11 tokens: prefixes of 4 and 8 alone, then the whole prompt


def test_slices_fit_in_a_step_beside_the_decoding_sequences_in_whole_blocks():
    assert slice_size(128, 256, 32, decoding=8) == 128  # the step has room for the whole slice
    assert slice_size(256, 256, 32, decoding=0) == 256
    assert slice_size(256, 256, 32, decoding=8) == 224
    assert slice_size(1000, 256, 32, decoding=8) == 224  # never more than a step holds
    assert slice_size(256, 256, 32, decoding=250) == 32  # at least one block


def test_a_slice_asks_for_one_greedy_token_and_keeps_only_the_speculative_settings():
    params = SamplingParams(
        max_new_tokens=50,
        n=3,
        temperature=0.7,
        seed=5,
        stop=("x",),
        logprobs=True,
        min_new_tokens=4,
        constraint=OutputConstraint(json_schema='{"type": "object"}'),
        speculation=SpeculativeDecoding(num_assistant_tokens=3, max_ngram_size=2),
    )
    assert slice_params(params) == SamplingParams(
        max_new_tokens=1,
        temperature=0.0,
        ignore_eos=True,
        speculation=SpeculativeDecoding(num_assistant_tokens=3, max_ngram_size=2),
    )


def test_prefixes_grow_by_a_slice_and_stop_short_of_the_whole_prompt():
    prefill = SlicedPrefill(admission=None, prompts=[LONG, LONG[:9]])
    assert prefill.next_prefix(4) == LONG[:4]
    assert prefill.next_prefix(2) == LONG[:6]
    assert prefill.next_prefix(4) == LONG[:10]
    # 1 token of LONG is left: the request computes it; the next prompt starts afresh.
    assert prefill.next_prefix(4) == LONG[:4]
    assert prefill.next_prefix(4) == LONG[:8]
    assert prefill.next_prefix(4) is None


@pytest.mark.parametrize(
    "settings, device, expected",
    [
        ({}, "CPU", 256),  # by default prompts past 256 tokens, in the policy's slices
        ({"max_num_batched_tokens": 32}, "CPU", 256),  # the engine's budget does not move it
        ({"long_prefill_token_threshold": 200}, "CPU", 192),  # whole 32-token blocks
        ({"long_prefill_token_threshold": 40}, "GPU.0", 32),  # 16-token blocks
        ({"long_prefill_token_threshold": 5}, "CPU", 32),  # at least one block
        ({"long_prefill_token_threshold": 0}, "CPU", 0),
        ({"enable_prefix_caching": False}, "CPU", 0),  # the slices build on the prefix cache
    ],
)
def test_slice_size_from_the_settings(settings, device, expected):
    assert prefill_slice_tokens(Settings(**settings), device) == expected


def test_slices_adapt_unless_their_size_is_set():
    assert prefill_itl_bound(Settings()) == 0.2  # max_itl_ms
    assert prefill_itl_bound(Settings(max_itl_ms=50)) == 0.05
    assert prefill_itl_bound(Settings(long_prefill_token_threshold=96)) is None  # fixed slices


@pytest.mark.parametrize("bound", [0, -5])
def test_a_bound_that_no_step_could_keep_is_refused_naming_it(bound):
    with pytest.raises(ValidationError, match="max_itl_ms"):
        Settings(max_itl_ms=bound)


@pytest.fixture
async def engine(nursery):
    return await start_scheduler(nursery, prefill_slice_tokens=SLICE, step_tokens=SLICE, kv_block_tokens=BLOCK)


def prompts_added(engine) -> list[list[int]]:
    return [handle.prompt for handle in engine.pipeline.handles]


async def test_a_long_prompt_is_prefilled_slice_by_slice_then_runs(engine):
    messages = await received(engine.scheduler, request(3, LONG))
    assert prompts_added(engine) == [LONG[:4], LONG[:8], LONG]
    assert [handle.left for handle in engine.pipeline.handles[:2]] == [0, 0]  # one token each
    assert "".join(m.text for m in messages if isinstance(m, Delta)) == "aaa"
    assert messages[-1] == Completed(prompt_tokens=len(LONG), completion_tokens=3)
    # The prefixes are the scheduler's own work: one choice, counted once.
    assert engine.observed.ends == [f"length {len(LONG)}+3"]
    assert engine.observed.queued_seconds and len(engine.observed.queued_seconds) == 1
    assert engine.scheduler.stats().prompt_tokens == len(LONG)


async def test_a_short_prompt_is_not_sliced(engine):
    await received(engine.scheduler, request(2, LONG[:SLICE]))
    assert prompts_added(engine) == [LONG[:SLICE]]


async def with_a_step_held(engine, first: dict, arriving: dict) -> dict[str, list]:
    """Submit `first`, hold the engine's first step, submit `arriving` meanwhile (they
    wait in the queue, in their order), then let the engine go; every request's
    messages, by name."""
    gate = engine.pipeline.gate = threading.Event()
    results = {}

    async def run(name, generation):
        results[name] = await received(engine.scheduler, generation)

    async with trio.open_nursery() as requests:
        for name, generation in first.items():
            requests.start_soon(run, name, generation)
        with trio.fail_after(120):  # bounds a hang only
            while len(engine.pipeline.handles) < 1:
                await trio.sleep(0.001)
            for queued, (name, generation) in enumerate(arriving.items(), 1):
                requests.start_soon(run, name, generation)
                while engine.scheduler.stats().queued < queued:  # they queue in this order
                    await trio.sleep(0.001)
        gate.set()
    return results


async def test_a_request_that_arrives_during_a_slice_goes_before_the_next_one(engine):
    # The first slice is in the engine, its step held: a short request arrives.
    results = await with_a_step_held(engine, {"long": request(2, LONG)}, {"short": request(2, [1])})
    added = prompts_added(engine)
    assert added[:3] == [LONG[:4], [1], LONG[:6]]  # one block less beside the short request
    assert added[-1] == LONG
    slices = [len(prompt) for prompt in added[2:-1]]
    assert slices == sorted(set(slices)) and all(length % BLOCK == 0 for length in slices)
    assert all(prompt == LONG[: len(prompt)] for prompt in added[2:-1])
    # The next slice gave the short request a step of its own.
    first_slice, short, next_slice = engine.pipeline.handles[:3]
    assert short.added_after_step == first_slice.added_after_step + 1
    assert next_slice.added_after_step == short.added_after_step + 1
    assert results["short"][-1] == Completed(prompt_tokens=1, completion_tokens=2)
    assert results["long"][-1] == Completed(prompt_tokens=len(LONG), completion_tokens=2)


async def test_a_long_prompt_admitted_with_a_short_one_lets_it_go_first(engine):
    # A step is held: the long and the short request wait in the queue together.
    results = await with_a_step_held(
        engine, {"busy": request(3, [1])}, {"long": request(2, LONG), "short": request(2, [1, 1])}
    )
    _busy, short, first_slice = engine.pipeline.handles[:3]
    assert short.prompt == [1, 1] and first_slice.prompt == LONG[: len(first_slice.prompt)]
    # The short request's first step is its own; the long prompt's first slice follows.
    assert first_slice.added_after_step == short.added_after_step + 1
    assert results["short"][-1] == Completed(prompt_tokens=2, completion_tokens=2)
    assert results["long"][-1] == Completed(prompt_tokens=len(LONG), completion_tokens=2)


def test_prompts_longer_than_the_bound_prefill_whole():
    assert prefills_whole(9, 8) and not prefills_whole(8, 8)
    assert not prefills_whole(100_000, 0)  # no bound: none must


@pytest.fixture
async def whole_engine(nursery):
    """Slices as `engine`, for a model whose prompts past 8 tokens must prefill whole."""
    return await start_scheduler(
        nursery, prefill_slice_tokens=SLICE, step_tokens=SLICE, kv_block_tokens=BLOCK, prefill_whole_above=8
    )


async def test_a_prompt_past_the_bound_is_not_sliced(whole_engine):
    messages = await received(whole_engine.scheduler, request(3, LONG))
    assert prompts_added(whole_engine) == [LONG]
    assert messages[-1] == Completed(prompt_tokens=len(LONG), completion_tokens=3)
    # Below the bound, slices as before.
    await received(whole_engine.scheduler, request(1, LONG[:8]))
    assert prompts_added(whole_engine)[1:] == [LONG[:4], LONG[:8]]


async def test_a_prompt_past_the_bound_waits_until_no_other_prompt_prefills(whole_engine):
    # A step is held: a short request and then a long one wait in the queue together.
    results = await with_a_step_held(
        whole_engine, {"busy": request(3, [1])}, {"short": request(2, [1, 1]), "long": request(2, LONG)}
    )
    _busy, short, long = whole_engine.pipeline.handles
    assert (short.prompt, long.prompt) == ([1, 1], LONG)
    # The short prompt is prefilled in a step of its own first: the long one's steps are its own.
    assert long.added_after_step > short.added_after_step
    assert results["long"][-1] == Completed(prompt_tokens=len(LONG), completion_tokens=2)
    assert results["short"][-1] == Completed(prompt_tokens=2, completion_tokens=2)


async def test_requests_after_a_prompt_past_the_bound_follow_it_into_the_engine(whole_engine):
    results = await with_a_step_held(
        whole_engine, {"busy": request(3, [1])}, {"long": request(2, LONG), "short": request(2, [1, 1])}
    )
    _busy, long, short = whole_engine.pipeline.handles
    # Behind it in the engine's order, the short prompt takes only what it leaves of the step.
    assert long.prompt == LONG and short.added_after_step == long.added_after_step
    assert results["short"][-1] == Completed(prompt_tokens=2, completion_tokens=2)


async def test_a_consumer_that_leaves_during_the_prefill_cancels_it(engine):
    gate = engine.pipeline.gate = threading.Event()
    entered = []

    async def consume() -> None:
        async with engine.scheduler.submit(request(2, LONG)):
            entered.append("the stream")

    async with trio.open_nursery() as consumer:
        consumer.start_soon(consume)
        with trio.fail_after(120):
            while len(engine.pipeline.handles) < 1:  # its first slice is in the engine
                await trio.sleep(0.001)
        consumer.cancel_scope.cancel()  # and its client leaves
    assert not entered  # the submitter waits while the prompt is prefilled
    gate.set()
    assert prompts_added(engine) == [LONG[:4]]
    assert engine.pipeline.handles[0].cancelled
    assert engine.scheduler.stats().running == 0
    assert engine.observed.ends == ["abort"]  # counted as a request whose client left
    # Nothing more is added for it, and the next request runs.
    assert (await received(engine.scheduler, request(1)))[-1] == Completed(prompt_tokens=1, completion_tokens=1)
    assert prompts_added(engine) == [LONG[:4], [1]]


async def test_a_slice_the_engine_drops_fails_its_request_alone(engine):
    dropped = DROPPED_PROMPT + LONG
    results = {}

    async def run(name, generation):
        results[name] = await received(engine.scheduler, generation)

    async with trio.open_nursery() as requests:
        requests.start_soon(run, "dropped", request(2, dropped))
        requests.start_soon(run, "kept", request(2, LONG))
    assert results["dropped"] == [Failed(results["dropped"][-1].message, "out_of_memory")]
    assert results["kept"][-1] == Completed(prompt_tokens=len(LONG), completion_tokens=2)
    # Its first slice was dropped, and nothing more was added for it.
    [dropped_slice] = [p for p in prompts_added(engine) if p[0] == DROPPED_PROMPT[0]]
    assert dropped_slice == dropped[: len(dropped_slice)] and len(dropped_slice) < len(dropped)
    assert engine.scheduler.stats().running == 0
    assert sorted(engine.observed.ends) == ["error", f"length {len(LONG)}+2"]


async def test_shutdown_during_the_prefill_fails_the_request(engine):
    gate = engine.pipeline.gate = threading.Event()
    async with trio.open_nursery() as requests:
        outcome = []

        async def run():
            outcome.extend(await received(engine.scheduler, request(2, LONG)))

        requests.start_soon(run)
        while len(engine.pipeline.handles) < 1:
            await trio.sleep(0.001)
        assert engine.scheduler.fail_all("server is shutting down") == 1
        gate.set()
    assert outcome == [Failed("server is shutting down", "shutting_down")]
    assert engine.pipeline.handles[0].cancelled
    assert engine.scheduler.stats().running == 0
    assert engine.observed.ends == ["error"]


async def test_several_prompts_and_choices_run_once_every_long_prompt_is_prefilled(engine):
    other = list(range(200, 209))
    generation = GenerationRequest([LONG, [1], other], SamplingParams(max_new_tokens=2, n=2, temperature=1.0, seed=0))
    messages = await received(engine.scheduler, generation)
    added = prompts_added(engine)
    assert added[:4] == [LONG[:4], LONG[:8], other[:4], other[:8]]  # the short prompt needs no slice
    assert sorted(map(tuple, added[4:])) == sorted([tuple(LONG)] * 2 + [(1,)] * 2 + [tuple(other)] * 2)
    assert messages[-1] == Completed(prompt_tokens=len(LONG) + 1 + len(other), completion_tokens=12)
    assert len(engine.observed.queued_seconds) == 6 and len(engine.observed.ends) == 6


async def test_a_slice_the_engine_refuses_fails_its_request_alone(engine):
    with pytest.raises(UnsupportedParams, match="refuses"):
        await received(engine.scheduler, request(2, REFUSED_PROMPT + LONG))
    assert engine.scheduler.stats().running == 0
    assert (await received(engine.scheduler, request(2, LONG)))[-1] == Completed(
        prompt_tokens=len(LONG), completion_tokens=2
    )
