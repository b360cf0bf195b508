"""The Messages API's reply and stream events, typed as Anthropic's API shapes them
(Message, its text / thinking / tool_use blocks, and the message_* and content_block_*
events).

Slotted dataclasses written to JSON by pydantic's serializer, like the Responses API's
events (see docs/benchmarks.md#responses-events for what that costs per event against
dicts and pydantic models).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

# ---- the message -----------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class Usage:
    # The engine does not report a request's prefix-cache hits: every prompt token is
    # counted in input_tokens.
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


@dataclass(slots=True, kw_only=True)
class TextBlock:
    type: Literal["text"] = "text"
    text: str = ""


@dataclass(slots=True, kw_only=True)
class ThinkingBlock:
    type: Literal["thinking"] = "thinking"
    thinking: str = ""
    signature: str = ""


@dataclass(slots=True, kw_only=True)
class ToolUseBlock:
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any] = field(default_factory=dict)


ContentBlock = TextBlock | ThinkingBlock | ToolUseBlock


@dataclass(slots=True, kw_only=True)
class Message:
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    content: list[ContentBlock] = field(default_factory=list)
    model: str
    stop_reason: str | None = None
    stop_sequence: str | None = None
    usage: Usage


# ---- stream events ---------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class MessageStart:
    type: Literal["message_start"] = "message_start"
    message: Message


@dataclass(slots=True, kw_only=True)
class ContentBlockStart:
    type: Literal["content_block_start"] = "content_block_start"
    index: int
    content_block: ContentBlock


@dataclass(slots=True, kw_only=True)
class TextPiece:
    type: Literal["text_delta"] = "text_delta"
    text: str


@dataclass(slots=True, kw_only=True)
class ThinkingPiece:
    type: Literal["thinking_delta"] = "thinking_delta"
    thinking: str


@dataclass(slots=True, kw_only=True)
class JsonPiece:
    type: Literal["input_json_delta"] = "input_json_delta"
    partial_json: str


@dataclass(slots=True, kw_only=True)
class ContentBlockDelta:
    type: Literal["content_block_delta"] = "content_block_delta"
    index: int
    delta: TextPiece | ThinkingPiece | JsonPiece


@dataclass(slots=True, kw_only=True)
class ContentBlockStop:
    type: Literal["content_block_stop"] = "content_block_stop"
    index: int


@dataclass(slots=True, kw_only=True)
class StopDetails:
    stop_reason: str
    stop_sequence: str | None


@dataclass(slots=True, kw_only=True)
class MessageDelta:
    type: Literal["message_delta"] = "message_delta"
    delta: StopDetails
    usage: Usage


@dataclass(slots=True, kw_only=True)
class MessageStop:
    type: Literal["message_stop"] = "message_stop"


@dataclass(slots=True, kw_only=True)
class ErrorDetails:
    type: str
    message: str


@dataclass(slots=True, kw_only=True)
class DetailedErrorDetails(ErrorDetails):
    """An error with Anthropic's `details` object, for the codes it defines one for."""

    details: dict[str, str]


@dataclass(slots=True, kw_only=True)
class ErrorEvent:
    """Anthropic's error object: a response body, and the stream's `error` event."""

    type: Literal["error"] = "error"
    error: ErrorDetails


@dataclass(slots=True, kw_only=True)
class Ping:
    type: Literal["ping"] = "ping"


MessageEvent = (
    MessageStart | ContentBlockStart | ContentBlockDelta | ContentBlockStop | MessageDelta | MessageStop | ErrorEvent
)
