"""The adaptive prefill (ovtrio/scheduler/prefill_policy.py): alone, a prompt takes the
engine's whole step budget; beside decoding sequences, what keeps a step within the
bound by the policy's estimate, oldest prompt first. Pure logic, and the scheduler over
the fake pipeline (fake_engine.py), whose handles keep the prompt they were added with."""

from __future__ import annotations

import threading

import pytest
import trio

from fake_engine import received, request, start_scheduler
from ovtrio.scheduler import Completed
from ovtrio.scheduler.prefill_policy import FIRST_TOKENS, PrefillPolicy, StepCost

BLOCK = 32


def policy(bound: float | None = 0.2, step_tokens: int = 2048) -> PrefillPolicy:
    return PrefillPolicy(step_tokens, BLOCK, slice_tokens=256, max_itl_seconds=bound)


def test_alone_a_prompt_takes_the_whole_step_budget():
    assert policy().slices([4096], decoding=0) == [2048]
    assert policy().slices([1000], decoding=0) == [1024]  # what it has left, in whole blocks


def test_beside_decoding_the_budget_keeps_a_step_within_the_bound():
    chosen = policy(bound=0.2)
    chosen.cost = StepCost(base=0.04, per_token=0.0005)  # 40 ms a decode step, 0.5 ms a prompt token
    # (0.2 - 0.04) / 0.0005 = 320 tokens: 10 blocks.
    assert chosen.budget(decoding=4) == 320
    assert chosen.slices([4096], decoding=4) == [320]
    tighter = policy(bound=0.1)
    tighter.cost = chosen.cost
    assert tighter.budget(decoding=4) == 96  # (0.1 - 0.04) / 0.0005 = 120 tokens: 3 whole blocks


def test_the_budget_never_passes_the_step_and_never_falls_below_a_block():
    chosen = policy(bound=0.2, step_tokens=512)
    chosen.cost = StepCost(base=0.001, per_token=1e-7)  # a fast machine: the estimate allows far more
    assert chosen.budget(decoding=4) == 480  # the step's budget less the decoding tokens, in whole blocks
    chosen.cost = StepCost(base=0.5, per_token=0.001)  # decode steps already past the bound
    assert chosen.budget(decoding=4) == BLOCK  # the prompt still progresses


def test_before_any_slice_was_measured_a_step_takes_the_first_budget():
    assert policy().budget(decoding=2) == FIRST_TOKENS


def test_the_step_budget_goes_to_the_oldest_prompt_first():
    chosen = policy(bound=0.2)
    chosen.cost = StepCost(base=0.04, per_token=0.0005)  # 320 tokens beside decoding
    assert chosen.slices([4096, 4096], decoding=4) == [320, 0]  # the younger one waits
    assert chosen.slices([100, 4096], decoding=4) == [128, 192]  # the oldest needs little: the rest goes on
    assert policy().slices([1500, 4096], decoding=0) == [1504, 544]  # alone they share the step


def test_fixed_slices_without_a_bound():
    fixed = policy(bound=None, step_tokens=256)
    assert fixed.slices([4096, 4096], decoding=0) == [256, 256]
    assert fixed.slices([4096], decoding=40) == [192]  # what the step leaves, in whole blocks


def test_the_estimate_learns_a_decode_step_and_a_prompt_token():
    cost = StepCost()
    cost.observe(0.2, 2048, decoding=0)  # a slice alone: its time is its tokens'
    assert cost.per_token == pytest.approx(0.2 / 2048)
    cost.observe(0.04, 0, decoding=4)  # a decode step
    assert cost.base == pytest.approx(0.04)
    cost.observe(0.04, 0, decoding=0)  # an empty step alone says nothing
    assert cost.base == pytest.approx(0.04)
    before = cost.per_token
    cost.observe(0.04 + 256 * 0.001, 256, decoding=4)  # a slice beside decoding: slower per token
    assert before < cost.per_token < 0.001  # moving towards it, not jumping
    cost.observe(0.01, 256, decoding=4)  # faster than a decode step: no negative cost
    assert cost.per_token >= 0


def test_a_slower_machine_shrinks_the_slices():
    chosen = policy(bound=0.2)
    chosen.cost = StepCost(base=0.02, per_token=0.0002)
    before = chosen.budget(decoding=4)
    for _ in range(10):  # other work on the machine: every step takes twice as long
        chosen.observe(0.04, 0, decoding=4)
        chosen.observe(0.04 + 0.0004 * before, before, decoding=4)
    assert chosen.budget(decoding=4) < before


# ---- the scheduler over the fake pipeline ------------------------------------------------

SLICE = 4  # prompts past 4 tokens are sliced
STEP = 8  # the engine's step budget
FAKE_BLOCK = 2
LONG = list(range(100, 121))  # 21 tokens


def prompts_added(engine) -> list[list[int]]:
    return [handle.prompt for handle in engine.pipeline.handles]


@pytest.fixture
async def adaptive(nursery):
    return await start_scheduler(
        nursery, prefill_slice_tokens=SLICE, step_tokens=STEP, kv_block_tokens=FAKE_BLOCK, max_itl_seconds=1.0
    )


async def test_alone_a_long_prompt_goes_in_slices_of_the_whole_step(adaptive):
    messages = await received(adaptive.scheduler, request(2, LONG))
    assert prompts_added(adaptive) == [LONG[:8], LONG[:16], LONG]
    assert messages[-1] == Completed(prompt_tokens=len(LONG), completion_tokens=2)
    stats = adaptive.scheduler.stats()
    assert (stats.prefill_slices, stats.prefill_slice_tokens) == (3, len(LONG))


class HeldAfter:
    """A gate for the fake pipeline's steps that lets `steps` through, then holds the next
    until `set()`; `holding` is set once a step waits at it."""

    def __init__(self, steps: int) -> None:
        self.passes = steps
        self.holding = threading.Event()
        self.opened = threading.Event()

    def wait(self, timeout: float) -> bool:
        if self.passes:
            self.passes -= 1
            return True
        self.holding.set()
        return self.opened.wait(timeout)  # a test that fails while holding it still ends

    def set(self) -> None:
        self.opened.set()


class FrozenCost(StepCost):
    """An estimate that the fake engine's instant steps do not move."""

    def observe(self, seconds: float, prompt_tokens: int, decoding: int) -> None:
        pass


async def test_beside_decoding_slices_shrink_to_the_bound_oldest_first(adaptive):
    # 0.5 s a decode step and 0.125 s a prompt token: a 1 s step holds 4 prompt tokens.
    adaptive.scheduler.prefill_policy.cost = FrozenCost(base=0.5, per_token=0.125)
    younger = [7, *LONG[1:]]
    results = {}

    async def run(name, generation):
        results[name] = await received(adaptive.scheduler, generation)

    # The third step is held (the decoding request decodes) while both long prompts
    # arrive, the older one first. Held from the start: a gate closed only once two steps
    # were seen could come after all 60 of the fake's instant steps on a busy machine.
    gate = adaptive.pipeline.gate = HeldAfter(2)
    async with trio.open_nursery() as requests:
        requests.start_soon(run, "decoding", request(60))
        await trio.to_thread.run_sync(gate.holding.wait, 120)
        with trio.fail_after(120):  # bounds a hang only
            requests.start_soon(run, "older", request(1, LONG))
            while adaptive.scheduler.stats().queued < 1:
                await trio.sleep(0.001)
            requests.start_soon(run, "younger", request(1, younger))
            while adaptive.scheduler.stats().queued < 2:
                await trio.sleep(0.001)
        gate.set()
    added = prompts_added(adaptive)
    older = [p for p in added if p[0] == LONG[0]]
    assert older == [LONG[:4], LONG[:8], LONG[:12], LONG[:16], LONG[:20], LONG]  # 4 tokens a step
    # The younger prompt waits while the older one takes the whole budget; it takes
    # what the older one's last part leaves, then the whole budget.
    assert [len(p) for p in added if p[0] == 7] == [2, 6, 10, 14, 18, 21]
    handles = adaptive.pipeline.handles
    older_whole = next(h for h in handles if h.prompt == LONG)
    younger_first = next(h for h in handles if h.prompt[:1] == [7])
    assert younger_first.added_after_step == older_whole.added_after_step
    assert results["older"][-1] == Completed(prompt_tokens=len(LONG), completion_tokens=1)
    assert results["younger"][-1] == Completed(prompt_tokens=len(LONG), completion_tokens=1)
    assert results["decoding"][-1] == Completed(prompt_tokens=1, completion_tokens=60)
