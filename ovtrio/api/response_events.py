"""The Responses API's stream: chat deltas turned into `response.*` events, in the order
OpenAI and OVMS document, each with a strictly increasing sequence_number.

    response.created, response.in_progress,
    [reasoning item: output_item.added, reasoning_summary_part.added,
     reasoning_summary_text.delta*, .done, reasoning_summary_part.done, output_item.done]
    [message item: output_item.added, content_part.added, output_text.delta*,
     output_text.done, content_part.done, output_item.done]
    [function_call item: output_item.added, function_call_arguments.delta*, .done,
     output_item.done]*
    response.completed | response.incomplete | response.failed

The writer only sees chat chunk bodies (from ChatFormatter), so reasoning splitting and
tool-call parsing are the chat endpoint's, unchanged.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any


def sse(event: dict[str, Any]) -> bytes:
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


class ResponseEvents:
    """One streamed response. `envelope(status, output, usage, incomplete, error)` makes
    the response object the created/completed events carry."""

    def __init__(self, envelope: Callable[..., dict[str, Any]]) -> None:
        self._envelope = envelope
        self._sequence = 0
        self._output: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the item being written
        self._calls: dict[int, dict[str, Any]] = {}  # tool-call index -> its item
        self._reason = "stop"

    # ---- events -------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def start(self) -> list[dict[str, Any]]:
        response = self._envelope("in_progress", [], None, False, None)
        return [self._event("response.created", response=response), self._event("response.in_progress", response=response)]

    def on_chunk(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """Events for one chat chunk body (or an {"error": ...} body)."""
        if "error" in chunk:
            return self._fail(chunk["error"])
        events: list[dict[str, Any]] = []
        for choice in chunk.get("choices") or []:
            delta = choice["delta"]
            if delta.get("reasoning_content"):
                events += self._reasoning(delta["reasoning_content"])
            if delta.get("content"):
                events += self._text(delta["content"], (choice.get("logprobs") or {}).get("content") or [])
            for call in delta.get("tool_calls") or []:
                events += self._call(call)
            if choice.get("finish_reason"):
                self._reason = choice["finish_reason"]
        if chunk.get("usage"):
            events += self._close()
            incomplete = self._reason == "length"
            kind = "response.incomplete" if incomplete else "response.completed"
            status = "incomplete" if incomplete else "completed"
            events.append(self._event(kind, response=self._envelope(status, self._output, chunk["usage"], incomplete, None)))
        return events

    # ---- items --------------------------------------------------------------------------

    def _add(self, item: dict[str, Any]) -> dict[str, Any]:
        self._output.append(item)
        self._open = item
        return self._event("response.output_item.added", output_index=len(self._output) - 1, item=dict(item))

    def _where(self) -> dict[str, Any]:
        assert self._open is not None
        return {"item_id": self._open["id"], "output_index": len(self._output) - 1}

    def _reasoning(self, text: str) -> list[dict[str, Any]]:
        events = []
        if self._open is None or self._open["type"] != "reasoning":
            events += self._close()
            events.append(self._add({"id": f"rs_{uuid.uuid4().hex}", "type": "reasoning", "summary": []}))
            part = {"type": "summary_text", "text": ""}
            events.append(self._event("response.reasoning_summary_part.added", **self._where(), summary_index=0, part=part))
            self._open["_text"] = ""
        self._open["_text"] += text
        events.append(self._event("response.reasoning_summary_text.delta", **self._where(), summary_index=0, delta=text))
        return events

    def _text(self, text: str, logprobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        events = []
        if self._open is None or self._open["type"] != "message":
            events += self._close()
            item = {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
            events.append(self._add(item))
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            events.append(self._event("response.content_part.added", **self._where(), content_index=0, part=part))
            self._open["_text"] = ""
            self._open["_logprobs"] = []
        self._open["_text"] += text
        self._open["_logprobs"] += logprobs
        events.append(
            self._event("response.output_text.delta", **self._where(), content_index=0, delta=text, logprobs=logprobs)
        )
        return events

    def _call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        events = []
        if call.get("id"):
            events += self._close()
            item = {
                "id": f"fc_{uuid.uuid4().hex}",
                "type": "function_call",
                "status": "in_progress",
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": "",
            }
            self._calls[call["index"]] = item
            events.append(self._add(item))
        fragment = call["function"].get("arguments") or ""
        if fragment:
            self._calls[call["index"]]["arguments"] += fragment
            events.append(self._event("response.function_call_arguments.delta", **self._where(), delta=fragment))
        return events

    def _close(self) -> list[dict[str, Any]]:
        """The closing events of the open item, which then takes its final form."""
        item, self._open = self._open, None
        if item is None:
            return []
        where = {"item_id": item["id"], "output_index": self._output.index(item)}
        events = []
        if item["type"] == "reasoning":
            text = item.pop("_text")
            part = {"type": "summary_text", "text": text}
            events.append(self._event("response.reasoning_summary_text.done", **where, summary_index=0, text=text))
            events.append(self._event("response.reasoning_summary_part.done", **where, summary_index=0, part=part))
            item["summary"] = [part]
        elif item["type"] == "message":
            text, logprobs = item.pop("_text"), item.pop("_logprobs")
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}
            events.append(self._event("response.output_text.done", **where, content_index=0, text=text, logprobs=logprobs))
            events.append(self._event("response.content_part.done", **where, content_index=0, part=part))
            item["content"] = [part]
            item["status"] = "incomplete" if self._reason == "length" else "completed"
        else:
            events.append(
                self._event("response.function_call_arguments.done", **where, name=item["name"], arguments=item["arguments"])
            )
            item["status"] = "completed"
        events.append(self._event("response.output_item.done", output_index=where["output_index"], item=dict(item)))
        return events

    def _fail(self, error: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._close()
        failure = {"code": "server_error", "message": error.get("message", "")}
        events.append(self._event("response.failed", response=self._envelope("failed", self._output, None, False, failure)))
        return events
