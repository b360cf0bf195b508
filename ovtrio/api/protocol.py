"""Request bodies of the OpenAI-compatible endpoints, validated with pydantic.

Validation is strict (no "5" for 5, no 1 for true), as OpenAI's API is. Fields that
OpenAI clients routinely send and that change nothing here are accepted and ignored.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ovtrio.api.errors import invalid

MAX_STOP_STRINGS = 4
MAX_SEED = 4294967295


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


StopField = Annotated[
    str | Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | None,
    Field(description="up to 4 strings where generation stops"),
]


class SamplingFields(_Body):
    """Fields shared by completions and chat completions."""

    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: int | None = None
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] | None = None
    stop: StopField = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None

    @model_validator(mode="after")
    def _check_top_k(self) -> "SamplingFields":
        if self.top_k is not None and self.top_k != -1 and self.top_k < 1:
            raise invalid("Invalid value for 'top_k': must be -1 (all tokens) or at least 1.", "top_k")
        return self

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionRequest(SamplingFields):
    prompt: str


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
