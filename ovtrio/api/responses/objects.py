"""The Responses API's output items and stream events, typed as OpenAI's spec shapes them
(ResponseOutputMessage, ResponseReasoningItem, ResponseFunctionToolCall, and the
`response.*` events of ResponseStreamEvent).

They are slotted dataclasses, written to JSON by pydantic's serializer (`to_json`), and
not pydantic models: an event is made for every token of every stream, and this typed
path is cheaper per event than a dict or a pydantic model (`python -m bench typed_events`;
see docs/benchmarks.md#responses-events), so no per-token path keeps dicts.

An event holds a snapshot of the item it names (`snapshot`): the item itself goes on
changing after the event is written.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from ovtrio.output import TokenLogprob

# ---- output items ----------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class TopLogProb:
    token: str
    logprob: float
    bytes: list[int]


@dataclass(slots=True, kw_only=True)
class LogProb:
    """A generated token (its text, as chat's logprobs name it, and its bytes)."""

    token: str
    logprob: float | None
    bytes: list[int]
    top_logprobs: list[TopLogProb]


def log_probs(entries: list[TokenLogprob] | None) -> list[LogProb]:
    return [
        LogProb(
            token=entry.text,
            logprob=entry.logprob,
            bytes=list(entry.token),
            top_logprobs=[TopLogProb(token=t.text, logprob=t.logprob, bytes=list(t.token)) for t in entry.top or ()],
        )
        for entry in entries or ()
    ]


@dataclass(slots=True, kw_only=True)
class OutputText:
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = field(default_factory=list)
    logprobs: list[LogProb] = field(default_factory=list)


@dataclass(slots=True, kw_only=True)
class SummaryText:
    type: Literal["summary_text"] = "summary_text"
    text: str


@dataclass(slots=True, kw_only=True)
class MessageItem:
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"] = "in_progress"
    content: list[OutputText] = field(default_factory=list)


@dataclass(slots=True, kw_only=True)
class ReasoningItem:
    id: str
    type: Literal["reasoning"] = "reasoning"
    summary: list[SummaryText] = field(default_factory=list)


@dataclass(slots=True, kw_only=True)
class FunctionCallItem:
    id: str
    type: Literal["function_call"] = "function_call"
    status: Literal["in_progress", "completed"] = "in_progress"
    call_id: str
    name: str
    arguments: str = ""


OutputItem = MessageItem | ReasoningItem | FunctionCallItem
Item = TypeVar("Item", bound=OutputItem)


def snapshot(item: Item) -> Item:
    """The item as it is now (items take a new list when their content changes)."""
    return copy.copy(item)


# ---- stream events ---------------------------------------------------------------------
# Each class is one shape; `type` names the event. sequence_number is set as the stream
# writes the event out.


@dataclass(slots=True, kw_only=True)
class StreamEvent:
    type: str
    sequence_number: int = 0


@dataclass(slots=True, kw_only=True)
class ResponseStateEvent(StreamEvent):
    """response.created, .in_progress, .completed, .incomplete, .failed."""

    response: Any  # body.Response


@dataclass(slots=True, kw_only=True)
class OutputItemEvent(StreamEvent):
    """response.output_item.added and .done."""

    output_index: int
    item: OutputItem


@dataclass(slots=True, kw_only=True)
class ItemEvent(StreamEvent):
    item_id: str
    output_index: int


@dataclass(slots=True, kw_only=True)
class ContentPartEvent(ItemEvent):
    """response.content_part.added and .done."""

    content_index: int = 0
    part: OutputText


@dataclass(slots=True, kw_only=True)
class OutputTextDelta(ItemEvent):
    type: str = "response.output_text.delta"
    content_index: int = 0
    delta: str
    logprobs: list[LogProb]


@dataclass(slots=True, kw_only=True)
class OutputTextDone(ItemEvent):
    type: str = "response.output_text.done"
    content_index: int = 0
    text: str
    logprobs: list[LogProb]


@dataclass(slots=True, kw_only=True)
class SummaryPartEvent(ItemEvent):
    """response.reasoning_summary_part.added and .done."""

    summary_index: int = 0
    part: SummaryText


@dataclass(slots=True, kw_only=True)
class SummaryTextDelta(ItemEvent):
    type: str = "response.reasoning_summary_text.delta"
    summary_index: int = 0
    delta: str


@dataclass(slots=True, kw_only=True)
class SummaryTextDone(ItemEvent):
    type: str = "response.reasoning_summary_text.done"
    summary_index: int = 0
    text: str


@dataclass(slots=True, kw_only=True)
class ArgumentsDelta(ItemEvent):
    type: str = "response.function_call_arguments.delta"
    delta: str


@dataclass(slots=True, kw_only=True)
class ArgumentsDone(ItemEvent):
    type: str = "response.function_call_arguments.done"
    name: str
    arguments: str
