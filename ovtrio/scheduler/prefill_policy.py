"""How many prompt tokens each prompt being prefilled gets in the next engine step.

Why: a step's prompt tokens decide two things that pull apart. A prompt alone prefills
fastest in large steps: on a 2-core Zen 5 the engine's prefill tokens a second grow
with the step's budget up to 1,024-2,048 tokens, stay flat to 4,096 and drop at 8,192
(the curve: docs/benchmarks.md#prefill-speed-against-the-step-budget); a 4,096-token
prompt took 1.5 times as long in 16 steps of 256 as in 2 of 2,048, and an 8,000-token
one 1.2 times. But every step is also one inter-token gap of every sequence decoding
beside it: a step that prefills 2,048 tokens holds them for as long.

The engine cannot be told: its step budget (SchedulerConfig.max_num_batched_tokens) is
fixed when the pipeline is built, and ContinuousBatchingPipeline has no call that changes
it. So the engine is built with the largest budget, and the scheduler holds each step
below it by the slices it adds (prefill.py).

The contract, with a bound (`max_itl_seconds`):

- No sequence decoding: the prompts being prefilled share a step of `step_tokens` (the
  engine's max_num_batched_tokens, configured where the curve is fastest), oldest
  first: a prompt alone goes in as few steps as the engine's budget allows.
- Sequences decoding: the step's prompt tokens are held to what keeps the step within
  `max_itl_seconds` by the estimate below, and shared oldest first: the request that has
  waited longest takes what it can use, the next what is left. The oldest always gets a
  KV block at least, so a prompt progresses even beside a step slower than the bound.
- Slices are whole KV blocks (prefill.py says why).

The estimate: a step takes `base + tokens x per_token` seconds, `base` learned from the
steps that prefill nothing while sequences decode, `per_token` from those that prefill
a slice (moving averages, so that it follows the machine's load). Until a slice has
been measured, `first_tokens` a step beside decoding sequences.

Without a bound (`max_itl_seconds` None), each prompt gets a fixed slice of
`slice_tokens`, or what the step leaves beside the decoding sequences if that is less
(the slices of ovtrio's earlier releases, and of an explicit
long_prefill_token_threshold).
"""

from __future__ import annotations

from dataclasses import dataclass

# How fast the estimate follows new steps: the weight of the newest one.
SMOOTHING = 0.3
# Prompt tokens a step beside decoding sequences takes before a slice was measured.
FIRST_TOKENS = 256


def whole_blocks(tokens: int, block_tokens: int) -> int:
    return tokens // block_tokens * block_tokens


def slice_size(slice_tokens: int, step_tokens: int, block_tokens: int, decoding: int) -> int:
    """Tokens of a fixed slice: `slice_tokens`, or what the step's budget (`step_tokens`)
    leaves beside the sequences the engine decodes if that is less (each takes a token of
    the budget first, and a slice that does not fit spills into a step of its own), in
    whole KV blocks, at least one."""
    return max(block_tokens, whole_blocks(min(slice_tokens, step_tokens - decoding), block_tokens))


@dataclass
class StepCost:
    """The estimate of a step's seconds: `base` with no prompt tokens, plus `per_token`
    for each (None: not measured yet)."""

    base: float | None = None
    per_token: float | None = None

    def observe(self, seconds: float, prompt_tokens: int, decoding: int) -> None:
        """Learn from one step that prefilled `prompt_tokens` beside `decoding` sequences."""
        if prompt_tokens == 0:
            if decoding:
                self.base = moving(self.base, seconds)
            return
        if not decoding and self.base is None:
            # Alone, the step's own floor is small beside a slice's compute.
            self.per_token = moving(self.per_token, seconds / prompt_tokens)
            return
        self.per_token = moving(self.per_token, max(0.0, seconds - (self.base or 0.0)) / prompt_tokens)


def moving(average: float | None, value: float) -> float:
    return value if average is None else average + SMOOTHING * (value - average)


class PrefillPolicy:
    """The slices of the prompts being prefilled, step by step (see the module's
    docstring for the contract)."""

    def __init__(
        self,
        step_tokens: int,
        block_tokens: int,
        slice_tokens: int,
        max_itl_seconds: float | None = None,
    ) -> None:
        """`step_tokens`: the engine's step budget; `block_tokens`: the KV block;
        `slice_tokens`: prompts longer than this are prefilled in slices (0: none are);
        `max_itl_seconds`: the bound on a step beside decoding sequences (None: fixed
        slices of `slice_tokens`)."""
        self.step_tokens = step_tokens
        self.block_tokens = block_tokens
        self.slice_tokens = slice_tokens
        self.max_itl_seconds = max_itl_seconds
        self.cost = StepCost()

    @property
    def adaptive(self) -> bool:
        return self.max_itl_seconds is not None

    def budget(self, decoding: int) -> int:
        """Prompt tokens the next step may take beside `decoding` sequences, in whole
        blocks (adaptive policy)."""
        room = max(self.block_tokens, whole_blocks(self.step_tokens - decoding, self.block_tokens))
        if not decoding:
            return room
        assert self.max_itl_seconds is not None
        per_token, base = self.cost.per_token, self.cost.base or 0.0
        if per_token is None:
            tokens = FIRST_TOKENS
        elif per_token <= 0:
            tokens = room
        else:
            tokens = int((self.max_itl_seconds - base) / per_token)
        return max(self.block_tokens, min(room, whole_blocks(tokens, self.block_tokens)))

    def slices(self, remaining: list[int], decoding: int) -> list[int]:
        """The next slice of each prompt being prefilled, oldest first (`remaining`: the
        tokens each has left to prefill): adaptive, the step's budget shared in that
        order (0: the prompt waits this step); fixed, a slice each."""
        if not self.adaptive:
            size = slice_size(self.slice_tokens, self.step_tokens, self.block_tokens, decoding)
            return [size] * len(remaining)
        left = self.budget(decoding)
        sizes = []
        for tokens in remaining:
            wanted = -(-tokens // self.block_tokens) * self.block_tokens  # whole blocks, rounded up
            size = min(wanted, left)
            sizes.append(size)
            left -= size
        return sizes

    def observe(self, seconds: float, prompt_tokens: int, decoding: int) -> None:
        """Learn from one step's time: it prefilled `prompt_tokens` (those the
        scheduler added for it) beside `decoding` sequences."""
        self.cost.observe(seconds, prompt_tokens, decoding)
