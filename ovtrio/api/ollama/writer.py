"""Ollama's records written from output events: as a stream goes, one record per piece
of the reply (content, thinking, a complete tool call), `done: false`, then the final
record, `done: true` with done_reason and the request's measures; or, for a unary
reply, that final record holding the whole reply. The same writer makes both, so a
unary reply and a stream cannot disagree.

/api/chat's records carry the reply in `message` (role, content, thinking,
tool_calls), /api/generate's in `response` and `thinking`. A tool call's arguments are
an object, as Ollama sends them: the parsed JSON the model wrote ({} for arguments cut
short or not an object). With `logprobs` asked for, a record's `logprobs` lists each
token generated since the previous record (those that became thinking or a tool call
too): its text, log-probability and bytes.

The measures are the server's own, in nanoseconds: total_duration from the request's
arrival to its last record; load_duration, the time it waited for its model (loaded
on demand, or already loaded: near 0); prompt_eval_duration, from the scheduler taking
the request into the engine to its first generated token (the prefill); eval_duration,
from its first generated token to its last; the counts are the scheduler's (prompt
tokens, generated tokens). A measure the request has no figure for (eval_duration of
a one-token reply) is left out, as Ollama's Go types leave out zeros.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ovtrio.api.errors import api_error
from ovtrio.output import ChoiceFinished, OutputEvent, ReasoningDelta, TextDelta, TokenLogprob, ToolCallDone
from ovtrio.scheduler import Completed, Failed

Record = dict[str, Any]


def created_at() -> str:
    """Now, as Go writes a time.Time in JSON (RFC 3339, UTC)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def nanoseconds(seconds: float) -> int:
    return max(0, round(seconds * 1e9))


@dataclass
class Clock:
    """When the request arrived (time.monotonic()) and how long it waited for its model."""

    began: float = field(default_factory=time.monotonic)
    load_seconds: float = 0.0

    def model_ready(self, since: float) -> None:
        self.load_seconds = time.monotonic() - since


def arguments_object(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _logprobs(entries: list[TokenLogprob] | None) -> list[Record] | None:
    """Ollama's Logprob entries: each generated token's text, log-probability and bytes."""
    if entries is None:
        return None
    return [
        {"token": entry.text, "logprob": entry.logprob, "bytes": list(entry.token)}
        for entry in entries
        if entry.logprob is not None
    ]


def done_record(model: str, chat: bool, reason: str) -> Record:
    """A final record with nothing generated: a model loaded or unloaded."""
    record: Record = {"model": model, "created_at": created_at()}
    if chat:
        record["message"] = {"role": "assistant", "content": ""}
    else:
        record["response"] = ""
    return {**record, "done": True, "done_reason": reason}


class OllamaWriter:
    def __init__(self, model: str, chat: bool, clock: Clock) -> None:
        """`model`: the name the client gave; `chat`: /api/chat's records (else /api/generate's)."""
        self.model = model
        self.chat = chat
        self.clock = clock
        self.content: list[str] = []
        self.thinking: list[str] = []
        self.tool_calls: list[Record] = []
        self.logprobs: list[Record] | None = None  # when they were asked for
        self.done_reason = "stop"
        self.final: Record | None = None

    def opening(self) -> list[Record]:
        return []

    def _record(
        self,
        content: str,
        thinking: str | None = None,
        tool_calls: list[Record] | None = None,
        logprobs: list[Record] | None = None,
    ) -> Record:
        record: Record = {"model": self.model, "created_at": created_at()}
        if self.chat:
            message: Record = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            if tool_calls:
                message["tool_calls"] = tool_calls
            record["message"] = message
        else:
            record["response"] = content
            if thinking:
                record["thinking"] = thinking
            if tool_calls:
                record["tool_calls"] = tool_calls
        record["done"] = False
        if logprobs:
            record["logprobs"] = logprobs
        return record

    def write(self, events: list[OutputEvent]) -> list[Record]:
        records: list[Record] = []
        for event in events:
            if isinstance(event, TextDelta):
                logprobs = _logprobs(event.logprobs)
                if logprobs is not None:
                    self.logprobs = (self.logprobs or []) + logprobs
                if event.text or logprobs:
                    self.content.append(event.text)
                    records.append(self._record(event.text, logprobs=logprobs))
            elif isinstance(event, ReasoningDelta):
                self.thinking.append(event.text)
                records.append(self._record("", thinking=event.text))
            elif isinstance(event, ToolCallDone):
                call = {
                    "id": event.id,
                    "function": {
                        "index": event.call,
                        "name": event.name,
                        "arguments": arguments_object(event.arguments),
                    },
                }
                self.tool_calls.append(call)
                records.append(self._record("", tool_calls=[call]))
            elif isinstance(event, ChoiceFinished):
                self.done_reason = "length" if event.reason == "length" else "stop"
            elif isinstance(event, Completed):
                self.final = self._final(event)
                records.append(self.final)
            elif isinstance(event, Failed):
                records.append({"error": api_error(event).message})
        return records

    def _final(self, done: Completed) -> Record:
        record = self._record("")
        record.update(done=True, done_reason=self.done_reason, **self._measures(done))
        return record

    def _measures(self, done: Completed) -> Record:
        measures = {
            "total_duration": nanoseconds(time.monotonic() - self.clock.began),
            "load_duration": nanoseconds(self.clock.load_seconds),
            "prompt_eval_count": done.prompt_tokens,
            "prompt_eval_duration": 0,
            "eval_count": done.completion_tokens,
            "eval_duration": 0,
        }
        timings = done.timings
        if timings is not None and timings.first_token is not None:
            if timings.added is not None:
                measures["prompt_eval_duration"] = nanoseconds(timings.first_token - timings.added)
            if timings.last_token is not None:
                measures["eval_duration"] = nanoseconds(timings.last_token - timings.first_token)
        return {name: value for name, value in measures.items() if value}

    def reply(self) -> Record:
        """The unary reply: the final record with the whole reply in it."""
        assert self.final is not None, "the request has not completed"
        reply = self._record(
            "".join(self.content), "".join(self.thinking) or None, self.tool_calls or None, self.logprobs
        )
        parts = ("message", "response", "thinking", "logprobs")
        done = {key: value for key, value in self.final.items() if key not in parts}
        return {**reply, **done}
