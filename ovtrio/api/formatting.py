"""OpenAI response objects for completions and chat completions, unary and streamed.

Each formatter is made once per request and fixes what every chunk shares (id,
created, model); `chunk_*` methods return SSE-ready dicts, `unary` the whole body.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ovtrio.scheduler import Completed


def usage_body(done: Completed) -> dict[str, int]:
    return {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
    }


@dataclass
class _Formatter:
    model: str
    system_fingerprint: str
    include_usage: bool = False
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

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


@dataclass
class CompletionFormatter(_Formatter):
    def __post_init__(self) -> None:
        self.id = self.id or f"cmpl-{uuid.uuid4().hex}"

    def opening_chunks(self) -> list[dict[str, Any]]:
        return []

    def chunk_text(self, index: int, text: str) -> dict[str, Any]:
        return self._envelope(
            "text_completion", [{"index": index, "text": text, "logprobs": None, "finish_reason": None}]
        )

    def chunk_finish(self, index: int, reason: str) -> dict[str, Any]:
        return self._envelope(
            "text_completion", [{"index": index, "text": "", "logprobs": None, "finish_reason": reason}]
        )

    def chunk_usage(self, done: Completed) -> dict[str, Any]:
        body = self._envelope("text_completion", [])
        body["usage"] = usage_body(done)
        return body

    def unary(self, texts: list[str], reasons: list[str], done: Completed) -> dict[str, Any]:
        choices = [
            {"index": i, "text": text, "logprobs": None, "finish_reason": reason}
            for i, (text, reason) in enumerate(zip(texts, reasons))
        ]
        body = self._envelope("text_completion", choices)
        body["usage"] = usage_body(done)
        return body


@dataclass
class ChatFormatter(_Formatter):
    def __post_init__(self) -> None:
        self.id = self.id or f"chatcmpl-{uuid.uuid4().hex}"

    def _chunk(self, index: int, delta: dict[str, Any], reason: str | None) -> dict[str, Any]:
        return self._envelope(
            "chat.completion.chunk", [{"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}]
        )

    def opening_chunks(self) -> list[dict[str, Any]]:
        return [self._chunk(0, {"role": "assistant", "content": ""}, None)]

    def chunk_text(self, index: int, text: str) -> dict[str, Any]:
        return self._chunk(index, {"content": text}, None)

    def chunk_finish(self, index: int, reason: str) -> dict[str, Any]:
        return self._chunk(index, {}, reason)

    def chunk_usage(self, done: Completed) -> dict[str, Any]:
        body = self._envelope("chat.completion.chunk", [])
        body["usage"] = usage_body(done)
        return body

    def unary(self, texts: list[str], reasons: list[str], done: Completed) -> dict[str, Any]:
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": reason,
            }
            for i, (text, reason) in enumerate(zip(texts, reasons))
        ]
        body = self._envelope("chat.completion", choices)
        body["usage"] = usage_body(done)
        return body


Formatter = CompletionFormatter | ChatFormatter
