"""Messages API events written from output events, in Anthropic's order:

    message_start
    [content_block_start, content_block_delta*, content_block_stop]*   (thinking, text, tool_use)
    message_delta (stop_reason, stop_sequence, usage), message_stop

or an `error` event if the request fails after the stream began. The same writer makes
the unary reply: `message` is the Message object the events add up to, complete once
the request has ended, so a unary reply and a stream cannot disagree. When a block
opens and closes is BlockWriter's rule (ovtrio/api/blocks.py), shared with the Responses
API's output items.

A stop sequence that ended the reply is cut off by the scheduler, which names it
(ChoiceFinished.stop): it becomes `stop_sequence`, as Anthropic reports it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ovtrio.api.blocks import BlockWriter, Kind
from ovtrio.api.errors import api_error
from ovtrio.api.messages.errors import error_event
from ovtrio.api.messages.objects import (
    ContentBlock,
    ContentBlockDelta,
    ContentBlockStart,
    ContentBlockStop,
    JsonPiece,
    Message,
    MessageDelta,
    MessageEvent,
    MessageStart,
    MessageStop,
    StopDetails,
    TextBlock,
    TextPiece,
    ThinkingBlock,
    ThinkingPiece,
    ToolUseBlock,
    Usage,
)
from ovtrio.output import ChoiceFinished, OutputEvent, ToolCallArguments, ToolCallDone, ToolCallStarted
from ovtrio.scheduler import Completed, Failed

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def tool_use_id(call_id: str) -> str:
    """Anthropic's `toolu_` id for a parsed call's id (`call_…`, or a Mistral-style one)."""
    return "toolu_" + call_id.removeprefix("call_")


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the `input` object; {} for arguments cut short (the reply
    then says max_tokens) or not an object."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class MessageWriter(BlockWriter[ContentBlock, MessageEvent]):
    def __init__(
        self,
        message_id: str,
        model: str,
        input_tokens: int,
        one_call: bool = False,
    ) -> None:
        """`one_call`: disable_parallel_tool_use; a model that writes more calls anyway
        has only its first one returned."""
        super().__init__()
        self.message = Message(id=message_id, model=model, usage=Usage(input_tokens=input_tokens, output_tokens=0))
        self.failed: Failed | None = None
        self.ended = False
        self._arguments: dict[str, str] = {}  # a tool_use block's id -> its arguments so far
        self._one_call = one_call

    # ---- the stream ----------------------------------------------------------------------

    def opening(self) -> list[MessageEvent]:
        message = dataclasses.replace(self.message, content=[], usage=dataclasses.replace(self.message.usage))
        return [MessageStart(message=message)]

    def write(self, events: list[OutputEvent]) -> list[MessageEvent]:
        if self._one_call:
            calls = (ToolCallStarted, ToolCallArguments, ToolCallDone)
            events = [event for event in events if not (isinstance(event, calls) and event.call > 0)]
        return super().write(events)

    # ---- blocks --------------------------------------------------------------------------

    def _index(self, block: ContentBlock) -> int:
        return next(i for i, each in enumerate(self.message.content) if each is block)

    def new_block(self, kind: Kind, call: ToolCallStarted | None) -> ContentBlock:
        block: ContentBlock
        if call is not None:
            block = ToolUseBlock(id=tool_use_id(call.id), name=call.name)
            self._arguments[block.id] = ""
        else:
            block = TextBlock() if kind == "text" else ThinkingBlock()
        self.message.content.append(block)
        return block

    def started(self, block: ContentBlock, kind: Kind) -> list[MessageEvent]:
        return [ContentBlockStart(index=self._index(block), content_block=dataclasses.replace(block))]

    def grown(self, block: ContentBlock, kind: Kind, text: str) -> list[MessageEvent]:
        if isinstance(block, ToolUseBlock):
            self._arguments[block.id] += text
            return [ContentBlockDelta(index=self._index(block), delta=JsonPiece(partial_json=text))]
        delta: TextPiece | ThinkingPiece
        if isinstance(block, TextBlock):
            block.text += text
            delta = TextPiece(text=text)
        elif isinstance(block, ThinkingBlock):
            block.thinking += text
            delta = ThinkingPiece(thinking=text)
        else:
            return []
        return [ContentBlockDelta(index=self._index(block), delta=delta)]

    def closed(self, block: ContentBlock, kind: Kind) -> list[MessageEvent]:
        if isinstance(block, ToolUseBlock):
            block.input = tool_input(self._arguments[block.id])
        return [ContentBlockStop(index=self._index(block))]

    # ---- the end -------------------------------------------------------------------------

    def choice_finished(self, finished: ChoiceFinished) -> list[MessageEvent]:
        """The reply is over; a stop sequence that ended it is named."""
        if finished.stop is not None:
            self.message.stop_reason = "stop_sequence"
            self.message.stop_sequence = finished.stop
        else:
            self.message.stop_reason = STOP_REASONS.get(finished.reason, "end_turn")
        return self.close()

    def request_completed(self, done: Completed) -> list[MessageEvent]:
        events = self.close()
        self.ended = True
        self.message.usage = Usage(input_tokens=done.prompt_tokens, output_tokens=done.completion_tokens)
        self.message.stop_reason = self.message.stop_reason or "end_turn"
        delta = StopDetails(stop_reason=self.message.stop_reason, stop_sequence=self.message.stop_sequence)
        return events + [MessageDelta(delta=delta, usage=dataclasses.replace(self.message.usage)), MessageStop()]

    def request_failed(self, failed: Failed) -> list[MessageEvent]:
        self.ended = True
        self.failed = failed
        return [error_event(api_error(failed))]
