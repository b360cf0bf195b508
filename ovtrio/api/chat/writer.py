"""Chat completion objects written from output events: `chat.completion.chunk`s as a
stream goes, and the unary `chat.completion` from the aggregated outcome."""

from __future__ import annotations

from typing import Any

from ovtrio.api.chunks import Envelope, logprob_entries
from ovtrio.output import (
    ChoiceFinished,
    ChoiceResult,
    Outcome,
    OutputEvent,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallArguments,
    ToolCallStarted,
)
from ovtrio.scheduler import Completed, Failed

CHUNK = "chat.completion.chunk"


def _logprobs(logprobs: list[TokenLogprob] | None) -> dict[str, Any] | None:
    return None if logprobs is None else {"content": logprob_entries(logprobs), "refusal": None}


def _reasoning(text: str) -> dict[str, str]:
    # Under both names: "reasoning_content" (vLLM, OVMS) and "reasoning" (newer clients).
    return {"reasoning_content": text, "reasoning": text}


class ChatWriter:
    def __init__(
        self, envelope: Envelope, *, choices: int = 1, logprobs: bool = False, calls_forced: bool = False
    ) -> None:
        """`calls_forced`: the request forces a tool call (tool_choice "required" or a
        named function), so each choice carries tool calls and no content."""
        self.envelope = envelope
        self.choices = choices
        self.logprobs = logprobs
        self.calls_forced = calls_forced

    def _chunk(
        self, index: int, delta: dict[str, Any], reason: str | None = None, logprobs: Any = None
    ) -> dict[str, Any]:
        return self.envelope.wrap(
            CHUNK, [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}]
        )

    def opening(self) -> list[dict[str, Any]]:
        # As OpenAI's: content null in a choice that carries tool calls (a client reading
        # "" would begin a text part before the call).
        content = None if self.calls_forced else ""
        return [self._chunk(i, {"role": "assistant", "content": content}) for i in range(self.choices)]

    def write(self, events: list[OutputEvent]) -> list[dict[str, Any]]:
        chunks = []
        merged = -1  # an arguments fragment already sent with its call's first chunk
        for at, event in enumerate(events):
            if isinstance(event, TextDelta):
                chunks.append(self._chunk(event.choice, {"content": event.text}, None, _logprobs(event.logprobs)))
            elif isinstance(event, ReasoningDelta):
                chunks.append(self._chunk(event.choice, _reasoning(event.text)))
            elif isinstance(event, ToolCallStarted):
                following = events[at + 1] if at + 1 < len(events) else None
                arguments = ""
                if isinstance(following, ToolCallArguments) and (following.choice, following.call) == (
                    event.choice,
                    event.call,
                ):
                    arguments, merged = following.fragment, at + 1
                call = {"index": event.call, "function": {"arguments": arguments, "name": event.name}}
                call["id"], call["type"] = event.id, "function"
                chunks.append(self._chunk(event.choice, {"tool_calls": [call]}))
            elif isinstance(event, ToolCallArguments) and at != merged:
                call = {"index": event.call, "function": {"arguments": event.fragment}}
                chunks.append(self._chunk(event.choice, {"tool_calls": [call]}))
            elif isinstance(event, ChoiceFinished):
                chunks.append(self._chunk(event.choice, {}, event.reason))
            elif isinstance(event, (Completed, Failed)):
                chunks += self.envelope.closing(CHUNK, event)
        return chunks

    def completion(self, outcome: Outcome) -> dict[str, Any]:
        choices = [
            {
                "index": i,
                "message": self._message(result),
                "logprobs": _logprobs(result.logprobs or []) if self.logprobs else None,
                "finish_reason": result.finish_reason,
            }
            for i, result in enumerate(outcome.choices)
        ]
        return self.envelope.unary("chat.completion", choices, outcome.usage)

    @staticmethod
    def _message(result: ChoiceResult) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": result.text, "refusal": None}
        if result.reasoning:
            message.update(_reasoning(result.reasoning))
        if result.tool_calls:
            message["content"] = result.text or None
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in result.tool_calls
            ]
        return message
