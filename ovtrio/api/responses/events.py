"""The Responses API's stream: output events written as `response.*` events, in the
order OpenAI and OVMS document, each with a strictly increasing sequence_number.

    response.created, response.in_progress,
    [reasoning item: output_item.added, reasoning_summary_part.added,
     reasoning_summary_text.delta*, .done, reasoning_summary_part.done, output_item.done]
    [message item: output_item.added, content_part.added, output_text.delta*,
     output_text.done, content_part.done, output_item.done]
    [function_call item: output_item.added, function_call_arguments.delta*, .done,
     output_item.done]*
    response.completed | response.incomplete | response.failed

The same events go out over SSE and the WebSocket.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ovtrio.api.chunks import logprob_entries
from ovtrio.api.errors import api_error
from ovtrio.api.responses.body import (
    function_call_item,
    message_item,
    message_status,
    reasoning_item,
    summary_part,
    text_part,
)
from ovtrio.parsing.ids import new_id
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

Envelope = Callable[..., dict[str, Any]]


class ResponseEvents:
    """One streamed response. `envelope(status, output, usage, incomplete, error)` makes
    the response object the created/completed events carry; `final` is that object once
    the response completed (for the caller to store)."""

    def __init__(self, envelope: Envelope) -> None:
        self._envelope = envelope
        self.final: dict[str, Any] | None = None
        self._sequence = 0
        self._output: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the item being written
        self._text = ""  # of the open reasoning or message item
        self._logprobs: list[dict[str, Any]] = []  # of the open message item
        self._calls: dict[tuple[int, int], dict[str, Any]] = {}  # (choice, call) -> its item
        self._reason = "stop"

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def opening(self) -> list[dict[str, Any]]:
        response = self._envelope("in_progress", [], None, False, None)
        return [self._event("response.created", response=response), self._event("response.in_progress", response=response)]

    def write(self, events: list[OutputEvent]) -> list[dict[str, Any]]:
        written: list[dict[str, Any]] = []
        for event in events:
            if isinstance(event, ReasoningDelta):
                written += self._reasoning(event.text)
            elif isinstance(event, TextDelta):
                if event.text:
                    written += self._message_text(event.text, logprob_entries(event.logprobs or []))
            elif isinstance(event, ToolCallStarted):
                written += self._call_started(event)
            elif isinstance(event, ToolCallArguments):
                written += self._call_arguments(event)
            elif isinstance(event, ToolCallDone):
                if self._open is self._calls.get((event.choice, event.call)):
                    written += self._close()
            elif isinstance(event, ChoiceFinished):
                self._reason = event.reason
            elif isinstance(event, Completed):
                written += self._complete(event)
            elif isinstance(event, Failed):
                written += self._fail(event)
        return written

    # ---- items --------------------------------------------------------------------------

    def _add(self, item: dict[str, Any]) -> dict[str, Any]:
        self._output.append(item)
        self._open = item
        return self._event("response.output_item.added", output_index=len(self._output) - 1, item=dict(item))

    def _where(self, item: dict[str, Any]) -> dict[str, Any]:
        index = next(i for i, each in enumerate(self._output) if each is item)
        return {"item_id": item["id"], "output_index": index}

    def _reasoning(self, text: str) -> list[dict[str, Any]]:
        events = []
        if self._open is None or self._open["type"] != "reasoning":
            events += self._close()
            events.append(self._add(reasoning_item(new_id("rs_"), [])))
            where = self._where(self._open)
            events.append(self._event("response.reasoning_summary_part.added", **where, summary_index=0, part=summary_part("")))
        self._text += text
        where = self._where(self._open)
        events.append(self._event("response.reasoning_summary_text.delta", **where, summary_index=0, delta=text))
        return events

    def _message_text(self, text: str, logprobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        events = []
        if self._open is None or self._open["type"] != "message":
            events += self._close()
            events.append(self._add(message_item(new_id("msg_"), "in_progress", [])))
            where = self._where(self._open)
            events.append(self._event("response.content_part.added", **where, content_index=0, part=text_part("", [])))
        self._text += text
        self._logprobs += logprobs
        where = self._where(self._open)
        events.append(self._event("response.output_text.delta", **where, content_index=0, delta=text, logprobs=logprobs))
        return events

    def _call_started(self, call: ToolCallStarted) -> list[dict[str, Any]]:
        events = self._close()
        item = function_call_item(new_id("fc_"), "in_progress", call.id, call.name, "")
        self._calls[(call.choice, call.call)] = item
        events.append(self._add(item))
        return events

    def _call_arguments(self, fragment: ToolCallArguments) -> list[dict[str, Any]]:
        item = self._calls[(fragment.choice, fragment.call)]
        item["arguments"] += fragment.fragment
        return [self._event("response.function_call_arguments.delta", **self._where(item), delta=fragment.fragment)]

    def _close(self) -> list[dict[str, Any]]:
        """The closing events of the open item, which then takes its final form."""
        item, self._open = self._open, None
        if item is None:
            return []
        where = self._where(item)
        events = []
        if item["type"] == "reasoning":
            part = summary_part(self._text)
            events.append(self._event("response.reasoning_summary_text.done", **where, summary_index=0, text=self._text))
            events.append(self._event("response.reasoning_summary_part.done", **where, summary_index=0, part=part))
            item["summary"] = [part]
        elif item["type"] == "message":
            part = text_part(self._text, self._logprobs)
            events.append(
                self._event("response.output_text.done", **where, content_index=0, text=self._text, logprobs=self._logprobs)
            )
            events.append(self._event("response.content_part.done", **where, content_index=0, part=part))
            item["content"] = [part]
            item["status"] = message_status(self._reason)
        else:
            events.append(
                self._event("response.function_call_arguments.done", **where, name=item["name"], arguments=item["arguments"])
            )
            item["status"] = "completed"
        self._text, self._logprobs = "", []
        events.append(self._event("response.output_item.done", output_index=where["output_index"], item=dict(item)))
        return events

    # ---- the end --------------------------------------------------------------------------

    def _complete(self, usage: Completed) -> list[dict[str, Any]]:
        events = self._close()
        incomplete = self._reason == "length"
        status = "incomplete" if incomplete else "completed"
        response = self._envelope(status, self._output, usage, incomplete, None)
        events.append(self._event(f"response.{status}", response=response))
        self.final = response
        return events

    def _fail(self, failed: Failed) -> list[dict[str, Any]]:
        events = self._close()
        failure = {"code": "server_error", "message": api_error(failed).message}
        events.append(self._event("response.failed", response=self._envelope("failed", self._output, None, False, failure)))
        return events
