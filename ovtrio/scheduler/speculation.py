"""Counting a speculating choice's draft tokens and accepted tokens, step by step.

The engine keeps these counts inside (its SpeculativeDecodingMetrics) but reports them
only from `generate()`, not to a caller that steps it. They follow from what each step
produces for a choice, read off its handle:

- accepted: a verification step yields the accepted candidates plus one token of the
  main model's own, so a step that brings k tokens accepted k - 1 (exact);
- drafted: the candidates the step verified. With prompt lookup they are recomputed
  here the way the engine finds them (the tokens after the latest earlier occurrence of
  the text's last n-gram, longest n first, capped at num_assistant_tokens and at the
  tokens left before max_tokens), so steps without a match propose nothing, as vLLM's
  n-gram proposer counts. A draft model with num_assistant_tokens proposes that many
  (capped the same way). With assistant_confidence_threshold the draft's length is not
  observable; it is counted as accepted + 1 (the candidate the main model rejected),
  or accepted when every candidate was taken: a lower bound.

A step that brings a choice its first token (the prefill) verifies nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ovtrio.scheduler.params import SamplingParams


@dataclass(frozen=True)
class StepTally:
    drafted: int  # candidate tokens the step verified
    accepted: int  # of which the main model accepted


@dataclass(eq=False)
class SpeculationTally:
    """One choice's speculation, fed each step's new token ids."""

    params: SamplingParams
    prompt_ids: list[int]
    generated: list[int] = field(default_factory=list)

    def step(self, ids: list[int]) -> StepTally | None:
        """The tally of the step that produced `ids`; None if it verified nothing."""
        if not ids:
            return None
        first = not self.generated
        drafted = 0 if first else self._proposed()
        self.generated.extend(ids)
        if first:
            return None
        accepted = len(ids) - 1
        if self.params.speculation.assistant_confidence_threshold > 0:
            drafted = accepted + 1 if accepted < self._room_before(len(ids)) else accepted
        drafted = max(drafted, accepted)  # the engine's candidates are never fewer than it accepted
        return StepTally(drafted, accepted) if drafted else None

    def _room_before(self, step_tokens: int) -> int:
        """Candidates the engine may propose when `step_tokens` were just added."""
        generated_before = len(self.generated) - step_tokens
        return max(0, self.params.max_new_tokens - generated_before - 1)

    def _proposed(self) -> int:
        room = max(0, self.params.max_new_tokens - len(self.generated) - 1)
        speculation = self.params.speculation
        wanted = min(speculation.num_assistant_tokens, room)
        if wanted == 0 or speculation.max_ngram_size == 0:
            return wanted
        return min(wanted, _ngram_candidates(self.prompt_ids + self.generated, speculation.max_ngram_size))


def _ngram_candidates(ids: list[int], max_ngram_size: int) -> int:
    """How many tokens follow the first earlier occurrence of the last n tokens of
    `ids`, for the longest n up to `max_ngram_size` that occurs (the engine's
    ContinuousBatchingForPromptLookupImpl::generate_candidates), uncapped."""
    tokens = np.asarray(ids, dtype=np.int64)
    length = len(tokens)
    if max_ngram_size >= length:
        max_ngram_size = length // 2
    for size in range(max_ngram_size, 0, -1):
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: length - 1], size)
        hits = np.flatnonzero((windows == tokens[length - size :]).all(axis=1))
        if hits.size:
            return length - (int(hits[0]) + size)
    return 0
