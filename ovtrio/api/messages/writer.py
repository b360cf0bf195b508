"""Messages API events written from output events, in Anthropic's order:

    message_start
    [content_block_start, content_block_delta*, content_block_stop]*   (thinking, text, tool_use)
    message_delta (stop_reason, stop_sequence, usage), message_stop

or an `error` event if the request fails after the stream began. The same writer makes
the unary reply: `message` is the Message object the events add up to, complete once
the request has ended, so a unary reply and a stream cannot disagree.

Stop sequences are asked of the scheduler with the matched text kept
(include_stop_str_in_output): the writer holds back the end of the open block, as long
as the longest stop sequence, and when the reply ends with one it is cut off and named
in `stop_sequence`, as Anthropic reports it.
"""

from __future__ import annotations

import json
from typing import Any

from ovtrio.api.errors import api_error
from ovtrio.api.messages.errors import error_body
from ovtrio.output import (
    ChoiceFinished,
    OutputEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallArguments,
    ToolCallDone,
    ToolCallStarted,
)
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


def usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    # The engine does not report a request's prefix-cache hits: every prompt token is
    # counted in input_tokens.
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


class MessageWriter:
    def __init__(
        self, message_id: str, model: str, input_tokens: int, stop_sequences: tuple[str, ...] = (), one_call: bool = False
    ) -> None:
        """`one_call`: disable_parallel_tool_use; a model that writes more calls anyway
        has only its first one returned."""
        self.message: dict[str, Any] = {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage(input_tokens, 0),
        }
        self.failed: Failed | None = None
        self.ended = False
        self._stops = sorted(stop_sequences, key=len, reverse=True)
        self._hold = max((len(s) for s in stop_sequences), default=0)
        self._open: dict[str, Any] | None = None  # the block being written
        self._held = ""  # the open text or thinking block's text not yet sent
        self._calls: dict[int, dict[str, Any]] = {}  # call index -> its tool_use block
        self._arguments: dict[int, str] = {}
        self._reason = "stop"
        self._one_call = one_call

    # ---- the stream ----------------------------------------------------------------------

    def opening(self) -> list[dict[str, Any]]:
        return [{"type": "message_start", "message": {**self.message, "content": []}}]

    def write(self, events: list[OutputEvent]) -> list[dict[str, Any]]:
        written: list[dict[str, Any]] = []
        for event in events:
            if self._one_call and isinstance(event, (ToolCallStarted, ToolCallArguments, ToolCallDone)) and event.call > 0:
                continue
            if isinstance(event, TextDelta):
                if event.text:
                    written += self._text("text", event.text)
            elif isinstance(event, ReasoningDelta):
                if event.text:
                    written += self._text("thinking", event.text)
            elif isinstance(event, ToolCallStarted):
                written += self._call_started(event)
            elif isinstance(event, ToolCallArguments):
                written += self._call_arguments(event)
            elif isinstance(event, ToolCallDone):
                block = self._calls.get(event.call)
                if block is not None:
                    block["input"] = tool_input(event.arguments)
                    if self._open is block:
                        written += self._close()
            elif isinstance(event, ChoiceFinished):
                self._reason = event.reason
                written += self._finish()
            elif isinstance(event, Completed):
                written += self._complete(event)
            elif isinstance(event, Failed):
                written += self._fail(event)
        return written

    # ---- blocks --------------------------------------------------------------------------

    def _start(self, block: dict[str, Any]) -> dict[str, Any]:
        self.message["content"].append(block)
        self._open = block
        shown = {**block, "input": {}} if block["type"] == "tool_use" else dict(block)
        return {"type": "content_block_start", "index": len(self.message["content"]) - 1, "content_block": shown}

    def _index(self) -> int:
        return len(self.message["content"]) - 1

    def _text(self, kind: str, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._open is None or self._open["type"] != kind:
            events += self._close()
            empty = {"type": "text", "text": ""} if kind == "text" else {"type": "thinking", "thinking": "", "signature": ""}
            events.append(self._start(empty))
        self._held += text
        keep = min(self._hold, len(self._held))
        ready, self._held = self._held[: len(self._held) - keep], self._held[len(self._held) - keep :]
        return events + self._delta(ready)

    def _delta(self, text: str) -> list[dict[str, Any]]:
        if not text or self._open is None:
            return []
        if self._open["type"] == "text":
            self._open["text"] += text
            delta = {"type": "text_delta", "text": text}
        else:
            self._open["thinking"] += text
            delta = {"type": "thinking_delta", "thinking": text}
        return [{"type": "content_block_delta", "index": self._index(), "delta": delta}]

    def _call_started(self, call: ToolCallStarted) -> list[dict[str, Any]]:
        events = self._close()
        block = {"type": "tool_use", "id": tool_use_id(call.id), "name": call.name, "input": {}}
        self._calls[call.call] = block
        self._arguments[call.call] = ""
        events.append(self._start(block))
        return events

    def _call_arguments(self, fragment: ToolCallArguments) -> list[dict[str, Any]]:
        block = self._calls.get(fragment.call)
        if block is None or not fragment.fragment:
            return []
        self._arguments[fragment.call] += fragment.fragment
        index = self.message["content"].index(block)
        delta = {"type": "input_json_delta", "partial_json": fragment.fragment}
        return [{"type": "content_block_delta", "index": index, "delta": delta}]

    def _close(self) -> list[dict[str, Any]]:
        """Send what the open block holds back, and stop it."""
        if self._open is None:
            return []
        events = self._delta(self._held)
        self._held = ""
        block, self._open = self._open, None
        if block["type"] == "tool_use":
            call = next(i for i, b in self._calls.items() if b is block)
            block["input"] = tool_input(self._arguments[call])
        return events + [{"type": "content_block_stop", "index": self.message["content"].index(block)}]

    # ---- the end -------------------------------------------------------------------------

    def _finish(self) -> list[dict[str, Any]]:
        """The reply is over: a stop sequence at its end is cut off and named."""
        stop_reason = STOP_REASONS.get(self._reason, "end_turn")
        if self._reason == "stop" and self._open is not None and self._open["type"] in ("text", "thinking"):
            field = self._open["type"]
            whole = self._open[field] + self._held
            for stop in self._stops:
                if whole.endswith(stop):
                    self._held = self._held[: max(0, len(self._held) - len(stop))]
                    self.message["stop_sequence"] = stop
                    stop_reason = "stop_sequence"
                    break
        self.message["stop_reason"] = stop_reason
        events = self._close()
        # A text block that a stop sequence emptied entirely still began and ends.
        return events

    def _complete(self, done: Completed) -> list[dict[str, Any]]:
        events = self._close()
        self.ended = True
        self.message["usage"] = usage(done.prompt_tokens, done.completion_tokens)
        delta = {"stop_reason": self.message["stop_reason"] or "end_turn", "stop_sequence": self.message["stop_sequence"]}
        self.message["stop_reason"] = delta["stop_reason"]
        return events + [
            {"type": "message_delta", "delta": delta, "usage": dict(self.message["usage"])},
            {"type": "message_stop"},
        ]

    def _fail(self, failed: Failed) -> list[dict[str, Any]]:
        self.ended = True
        self.failed = failed
        return [error_body(api_error(failed))]
