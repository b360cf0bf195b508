"""The body of /v1/chat/completions."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import Field, model_validator

from ovtrio.api.errors import invalid
from ovtrio.api.protocol.chat_messages import ChatMessage
from ovtrio.api.protocol.sampling_fields import SamplingFields
from ovtrio.api.protocol.tools import ToolAndReasoningFields
from ovtrio.scoring import MAX_TOP_LOGPROBS


class ChatCompletionRequest(SamplingFields, ToolAndReasoningFields):
    prompt_field: ClassVar[str] = "messages"

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    response_format: dict[str, Any] | None = None

    def output_format(self) -> dict[str, Any] | None:
        return self.response_format

    def wants_logprobs(self) -> bool:
        return self.logprobs

    def requested_max_tokens(self) -> tuple[int | None, str]:
        # max_completion_tokens, OpenAI's newer name, wins over max_tokens.
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"

    @model_validator(mode="after")
    def _check_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise invalid("top_logprobs requires logprobs=true.", "top_logprobs")
        return self
