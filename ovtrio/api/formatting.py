"""OpenAI response objects for completions and chat completions, unary and streamed.

Each formatter is made once per request and fixes what every chunk shares (id,
created, model); `text_chunks` / `finish_chunks` return the SSE-ready dicts for a
choice's new text and its end, `unary` the whole body. A chat choice under a forced
tool_choice is read back into tool calls (tool_choice.py) instead of content.
"""

from __future__ import annotations

import codecs
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ovtrio.scheduler import Completed
from ovtrio.reasoning import ReasoningSplitter
from ovtrio.tool_parsers import ParsedDelta, ToolCallParser


def usage_body(done: Completed) -> dict[str, int]:
    return {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
    }


@dataclass
class ChoiceOutput:
    """Everything one choice produced (the aggregate of its deltas)."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "stop"


TokenBytes = Callable[[int], bytes]


@dataclass
class _Formatter:
    model: str
    system_fingerprint: str
    token_bytes: TokenBytes
    include_usage: bool = False
    logprobs: bool = False
    choices: int = 1
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    _decoders: dict[int, Any] = field(default_factory=dict)

    def _envelope(self, object_name: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.system_fingerprint,
            "choices": choices,
        }
        if self.include_usage:
            body["usage"] = None
        return body

    def _token_texts(self, index: int, token_ids: list[int]) -> list[tuple[str, bytes]]:
        """Each token's share of choice `index`'s text, and the bytes it adds.

        A token that ends inside a UTF-8 character adds bytes but no text yet; the
        token that completes the character carries it. So the texts of a choice's
        entries join to exactly its text, and their bytes to the text's UTF-8.
        """
        decoder = self._decoders.get(index)
        if decoder is None:
            decoder = self._decoders[index] = codecs.getincrementaldecoder("utf-8")("replace")
        pieces = []
        for token_id in token_ids:
            data = self.token_bytes(token_id)
            pieces.append((decoder.decode(data), data))
        return pieces


@dataclass
class CompletionFormatter(_Formatter):
    # Text of each prompt, for echo; choice i belongs to prompt i // n.
    echo: list[str] | None = None
    n: int = 1
    _offsets: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.id = self.id or f"cmpl-{uuid.uuid4().hex}"

    def _echo_text(self, index: int) -> str:
        return self.echo[index // self.n] if self.echo else ""

    def _choice(self, index: int, text: str, logprobs: Any, reason: str | None) -> dict[str, Any]:
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}

    def _logprobs(self, index: int, token_ids: list[int], logprobs: list[float]) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        offset = self._offsets.get(index, len(self._echo_text(index)))
        tokens, offsets = [], []
        for token, _ in self._token_texts(index, token_ids):
            tokens.append(token)
            offsets.append(offset)
            offset += len(token)
        self._offsets[index] = offset
        return {
            "tokens": tokens,
            "token_logprobs": logprobs,
            # The engine reports the chosen token only; it stands as its own top entry.
            "top_logprobs": [{token: logprob} for token, logprob in zip(tokens, logprobs)],
            "text_offset": offsets,
        }

    def opening_chunks(self) -> list[dict[str, Any]]:
        if not self.echo:
            return []
        return [
            self._envelope("text_completion", [self._choice(i, self._echo_text(i), None, None)])
            for i in range(self.choices)
        ]

    def text_chunks(self, index: int, text: str, token_ids: list[int], logprobs: list[float]) -> list[dict[str, Any]]:
        if not text and not self.logprobs:
            return []
        choice = self._choice(index, text, self._logprobs(index, token_ids, logprobs), None)
        return [self._envelope("text_completion", [choice])]

    def finish_chunks(self, index: int, reason: str) -> list[dict[str, Any]]:
        return [self._envelope("text_completion", [self._choice(index, "", None, reason)])]

    def chunk_usage(self, done: Completed) -> dict[str, Any]:
        body = self._envelope("text_completion", [])
        body["usage"] = usage_body(done)
        return body

    def unary(self, outputs: list[ChoiceOutput], done: Completed) -> dict[str, Any]:
        choices = [
            self._choice(
                i,
                self._echo_text(i) + output.text,
                self._logprobs(i, output.token_ids, output.logprobs),
                output.finish_reason,
            )
            for i, output in enumerate(outputs)
        ]
        body = self._envelope("text_completion", choices)
        body["usage"] = usage_body(done)
        return body


@dataclass
class ChatFormatter(_Formatter):
    # Makes the parser that reads tool calls out of a choice's text (the model's own
    # format with tool_choice "auto", or the forced array with "required" / a name).
    tool_parser: Callable[[], ToolCallParser] | None = None
    # For thinking models: makes the splitter that takes <think>…</think> out of content.
    reasoning: Callable[[], ReasoningSplitter] | None = None
    _parsers: dict[int, ToolCallParser] = field(default_factory=dict)
    _splitters: dict[int, ReasoningSplitter] = field(default_factory=dict)

    def _split(self, index: int, text: str | None) -> tuple[str, str]:
        """(reasoning, answer) of the next text; the end of the choice when text is None."""
        if self.reasoning is None:
            return "", text or ""
        splitter = self._splitters.setdefault(index, self.reasoning())
        return splitter.finish() if text is None else splitter.feed(text)

    def _reasoning_chunk(self, index: int, reasoning: str) -> list[dict[str, Any]]:
        # Under both names: "reasoning_content" (vLLM, OVMS) and "reasoning" (newer clients).
        return [self._chunk(index, {"reasoning_content": reasoning, "reasoning": reasoning}, None)] if reasoning else []

    def _parser(self, index: int) -> ToolCallParser | None:
        if self.tool_parser is None:
            return None
        if index not in self._parsers:
            self._parsers[index] = self.tool_parser()
        return self._parsers[index]

    def _parsed_chunks(self, index: int, parsed: ParsedDelta, logprobs: Any = None) -> list[dict[str, Any]]:
        chunks = []
        if parsed.content or logprobs:
            chunks.append(self._chunk(index, {"content": parsed.content}, None, logprobs))
        for delta in parsed.tool_calls:
            call: dict[str, Any] = {"index": delta.index, "function": {"arguments": delta.arguments}}
            if delta.id is not None:
                call["id"], call["type"] = delta.id, "function"
                call["function"]["name"] = delta.name
            chunks.append(self._chunk(index, {"tool_calls": [call]}, None))
        return chunks

    def __post_init__(self) -> None:
        self.id = self.id or f"chatcmpl-{uuid.uuid4().hex}"

    def _logprobs(self, index: int, token_ids: list[int], logprobs: list[float]) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        content = []
        for (token, data), logprob in zip(self._token_texts(index, token_ids), logprobs):
            content.append(
                {
                    "token": token,
                    "logprob": logprob,
                    "bytes": list(data),
                    "top_logprobs": [],
                }
            )
        return {"content": content, "refusal": None}

    def _chunk(self, index: int, delta: dict[str, Any], reason: str | None, logprobs: Any = None) -> dict[str, Any]:
        return self._envelope(
            "chat.completion.chunk",
            [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}],
        )

    def opening_chunks(self) -> list[dict[str, Any]]:
        return [self._chunk(i, {"role": "assistant", "content": ""}, None) for i in range(self.choices)]

    def text_chunks(self, index: int, text: str, token_ids: list[int], logprobs: list[float]) -> list[dict[str, Any]]:
        reasoning, text = self._split(index, text)
        chunks = self._reasoning_chunk(index, reasoning)
        parser = self._parser(index)
        if parser is not None:
            return chunks + self._parsed_chunks(index, parser.feed(text), self._logprobs(index, token_ids, logprobs))
        if text or (self.logprobs and not reasoning):
            chunks.append(self._chunk(index, {"content": text}, None, self._logprobs(index, token_ids, logprobs)))
        return chunks

    def finish_chunks(self, index: int, reason: str) -> list[dict[str, Any]]:
        reasoning, text = self._split(index, None)
        chunks = self._reasoning_chunk(index, reasoning)
        parser = self._parser(index)
        if parser is not None:
            chunks += self._parsed_chunks(index, parser.feed(text)) + self._parsed_chunks(index, parser.finish())
            return [*chunks, self._chunk(index, {}, _finish_reason(reason, bool(parser.calls)))]
        if text:
            chunks.append(self._chunk(index, {"content": text}, None))
        return [*chunks, self._chunk(index, {}, reason)]

    def chunk_usage(self, done: Completed) -> dict[str, Any]:
        body = self._envelope("chat.completion.chunk", [])
        body["usage"] = usage_body(done)
        return body

    def _message(self, output: ChoiceOutput) -> tuple[dict[str, Any], str]:
        reasoning, text = ("", output.text)
        if self.reasoning is not None:
            reasoning, text = self.reasoning().parse(output.text)
        calls = []
        if self.tool_parser is not None:
            text, calls = self.tool_parser().parse(text)
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        if reasoning:
            message["reasoning_content"] = message["reasoning"] = reasoning
        if calls:
            message["content"] = text or None
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
            ]
        return message, _finish_reason(output.finish_reason, bool(calls))

    def unary(self, outputs: list[ChoiceOutput], done: Completed) -> dict[str, Any]:
        choices = []
        for i, output in enumerate(outputs):
            message, reason = self._message(output)
            choices.append(
                {
                    "index": i,
                    "message": message,
                    "logprobs": self._logprobs(i, output.token_ids, output.logprobs),
                    "finish_reason": reason,
                }
            )
        body = self._envelope("chat.completion", choices)
        body["usage"] = usage_body(done)
        return body


def _finish_reason(reason: str, made_calls: bool) -> str:
    # A choice cut short by max_tokens says so even if it had started a call.
    return "tool_calls" if made_calls and reason == "stop" else reason


Formatter = CompletionFormatter | ChatFormatter
