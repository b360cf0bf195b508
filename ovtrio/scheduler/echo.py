"""Splitting a scored prompt off the front of a sequence's output.

Asked to echo with logprobs (GenerationConfig.echo), the engine returns, in the first
read of each sequence, the prompt's ids with each one's log-probability (a placeholder
1.0 for the first token, which has no context), then the generated tokens as usual; with
max_new_tokens 0 only the prompt comes back. Beams each carry the prompt too.

The engine scores only the prompt positions it computes: a prompt whose KV blocks come
from the prefix cache comes back short (OpenVINO GenAI 2026.4: one id and one
log-probability for a fully cached prompt). The API refuses such requests while prefix
caching is on; checking the echoed ids against the prompt here turns any other shortfall
into a failure instead of wrong scores.
"""

from __future__ import annotations

from ovtrio.scheduler.messages import Prompt


class PromptNotScored(Exception):
    """The engine did not return a log-probability for every prompt token."""


class EchoedPrompt:
    """One sequence's prompt, collected from the front of its output until complete."""

    __slots__ = ("_index", "_prompt", "_ids", "_logprobs")

    def __init__(self, index: int, prompt_ids: list[int]) -> None:
        self._index = index
        self._prompt = prompt_ids
        self._ids: list[int] = []
        self._logprobs: list[float | None] = []

    @property
    def complete(self) -> bool:
        return len(self._ids) == len(self._prompt)

    def take(self, ids: list[int], logprobs: list[float]) -> tuple[list[int], list[float], Prompt | None]:
        """Remove the prompt's part from one read: (generated ids, their logprobs, the
        Prompt once all of it has arrived)."""
        wanted = len(self._prompt) - len(self._ids)
        head, head_logprobs = ids[:wanted], logprobs[:wanted]
        if len(head_logprobs) < len(head) or head != self._prompt[len(self._ids) : len(self._ids) + len(head)]:
            raise PromptNotScored(
                "the engine did not score every prompt token (its KV blocks came from the prefix cache)"
            )
        if not self._ids and head_logprobs:
            head_logprobs = [None, *head_logprobs[1:]]  # type: ignore[list-item]
        self._ids += head
        self._logprobs += head_logprobs
        prompt = Prompt(self._index, self._ids, self._logprobs) if self.complete else None
        return ids[wanted:], logprobs[wanted:], prompt
