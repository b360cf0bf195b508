"""The request bodies of Ollama's API, as its Go types (api/types.go) read them: every
field typed, unknown fields ignored, `stream` true unless it is sent false.

A field this server cannot honour is refused with a 400 naming it: `template` (Go
templates are not run here: the model's chat template is), `suffix` (no model here
is served with a fill-in-the-middle template), `context` (this server returns none to
send back), `top_logprobs` (`logprobs`, the chosen tokens', is served). `truncate` and `shift` are accepted: a prompt
too long for the context is refused either way, never cut or shifted."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from ovtrio.api.errors import invalid
from ovtrio.api.ollama.options import Options
from ovtrio.api.protocol import Body
from ovtrio.api.protocol.keep_alive import KeepAlive

Think = bool | Literal["low", "medium", "high"]
# "json", or a JSON schema; "" and null: no format.
Format = Literal["", "json"] | dict[str, Any]


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value  # Go's Message lowercases its role


class ToolCallFunction(Body):
    index: int | None = None
    name: Annotated[str, Field(min_length=1)]
    arguments: dict[str, Any] = Field(default_factory=dict)  # an object, not JSON text


class ToolCall(Body):
    id: str | None = None
    function: ToolCallFunction


class Message(Body):
    role: Annotated[Literal["system", "user", "assistant", "tool"], BeforeValidator(_lower)]
    content: str = ""
    thinking: str | None = None  # an earlier turn's thinking: accepted, left out of the prompt
    images: list[str] | None = None  # base64, without a data: prefix
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class GenerationBody(Body):
    """What /api/chat and /api/generate share."""

    model: Annotated[str, Field(min_length=1)]
    stream: bool = True
    format: Format | None = None
    keep_alive: KeepAlive | None = None
    options: Options | None = None
    think: Think | None = None
    truncate: bool | None = None
    shift: bool | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0)] | None = None

    @model_validator(mode="after")
    def _refuse_top_logprobs(self) -> GenerationBody:
        if self.top_logprobs:
            raise invalid(
                "'top_logprobs' is not served on this server's Ollama routes (the engine reports the chosen"
                " token's log-probability only); ask /v1/chat/completions, which scores them.",
                "top_logprobs",
                "unsupported_parameter",
            )
        return self


class ChatRequest(GenerationBody):
    """The body of POST /api/chat. No messages: the model is loaded (or with
    keep_alive 0, unloaded), and nothing is generated."""

    messages: list[Message] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None


class GenerateRequest(GenerationBody):
    """The body of POST /api/generate. An empty prompt loads the model (or with
    keep_alive 0, unloads it), and nothing is generated."""

    prompt: str = ""
    suffix: str = ""
    system: str = ""
    template: str = ""
    context: list[int] | None = None
    raw: bool = False
    images: list[str] | None = None

    @model_validator(mode="after")
    def _refuse_what_cannot_be_honoured(self) -> GenerateRequest:
        if self.template:
            raise invalid(
                "'template' cannot be honoured: this server does not run Go templates; the model's own chat"
                " template lays out the prompt (or send raw: true with the prompt laid out).",
                "template",
                "unsupported_parameter",
            )
        if self.suffix:
            raise invalid(
                "'suffix' cannot be honoured: no model here is served with a fill-in-the-middle template.",
                "suffix",
                "unsupported_parameter",
            )
        if self.context:
            raise invalid(
                "'context' cannot be honoured: this server returns no context to send back; send the"
                " conversation to /api/chat instead.",
                "context",
                "unsupported_parameter",
            )
        return self


class EmbedRequest(Body):
    """The body of POST /api/embed."""

    model: Annotated[str, Field(min_length=1)]
    input: str | list[str]
    truncate: bool = True
    dimensions: Annotated[int, Field(ge=1)] | None = None
    keep_alive: KeepAlive | None = None
    options: Options | None = None


class EmbeddingsRequest(Body):
    """The body of POST /api/embeddings (Ollama's older route: one prompt)."""

    model: Annotated[str, Field(min_length=1)]
    prompt: str
    keep_alive: KeepAlive | None = None
    options: Options | None = None


class ShowRequest(Body):
    """The body of POST /api/show (`name`: the older spelling of `model`)."""

    model: str = ""
    name: str = ""
    verbose: bool = False

    def named(self) -> str:
        if not (self.model or self.name):
            raise invalid("Missing required parameter: 'model'.", "model", "missing_required_parameter")
        return self.model or self.name
