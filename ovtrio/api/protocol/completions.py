"""The body of /v1/completions."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field, model_validator

from ovtrio.api.errors import invalid
from ovtrio.api.protocol.sampling_fields import SamplingFields
from ovtrio.scoring import MAX_TOP_LOGPROBS

TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class CompletionRequest(SamplingFields):
    served_fields: ClassVar[frozenset[str]] = frozenset({"prompt_logprobs"})

    prompt: str | Annotated[list[str], Field(min_length=1)] | TokenIds | Annotated[list[TokenIds], Field(min_length=1)]
    # 0 with echo scores the prompt and generates nothing (OpenAI's legacy scoring).
    max_tokens: Annotated[int, Field(ge=0)] | None = None
    echo: bool = False
    # The chosen token's log-probability and the `logprobs` most likely tokens'.
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    # vLLM's: each prompt token's log-probability and rank, and the `prompt_logprobs`
    # most likely tokens', in the choice's `prompt_logprobs`.
    prompt_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None

    def wants_logprobs(self) -> bool:
        return self.logprobs is not None  # 0 asks for them too: the chosen token only

    def echoes_logprobs(self) -> bool:
        """Echo with logprobs: the logprobs cover the prompt's tokens, then the completion's."""
        return self.echo and self.logprobs is not None

    def scores_prompt(self) -> bool:
        """Whether the prompt's log-probabilities are asked for (the scoring path)."""
        return self.echoes_logprobs() or self.prompt_logprobs is not None

    def top_logprobs(self) -> int:
        """How many of the most likely tokens each logprobs entry lists."""
        return self.logprobs or 0

    def needs_scoring(self) -> bool:
        """Whether the scoring path runs: the prompt is scored, or the generated tokens'
        most likely alternatives are asked for (the engine reports the chosen token's only)."""
        return self.scores_prompt() or (self.top_logprobs() > 0 and self.max_tokens != 0)

    @model_validator(mode="after")
    def _check_logprobs(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:
            raise invalid(
                "Invalid value for 'max_tokens': 0 generates nothing, which is only useful with echo=true"
                " (to score the prompt); it must be at least 1.",
                "max_tokens",
            )
        return self
