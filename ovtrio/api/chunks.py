"""What chat and completion objects share: the envelope every chunk and body carries
(id, created, model, system_fingerprint), usage, and log-probability entries."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ovtrio.api.errors import api_error
from ovtrio.output import TokenLogprob
from ovtrio.scheduler import Completed, Failed


def usage_body(done: Completed) -> dict[str, int]:
    return {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
    }


def logprob_entries(logprobs: list[TokenLogprob]) -> list[dict[str, Any]]:
    """Chat's (and the Responses API's) form: each chosen token with its bytes, and the
    most likely tokens at its position when they were asked for (and scored)."""
    return [
        {
            "token": entry.text,
            "logprob": entry.logprob,
            "bytes": list(entry.token),
            "top_logprobs": [
                {"token": top.text, "logprob": top.logprob, "bytes": list(top.token)} for top in entry.top or []
            ],
        }
        for entry in logprobs
    ]


@dataclass
class Envelope:
    """What every chunk of one response shares; made once per request."""

    id: str
    model: str
    system_fingerprint: str
    include_usage: bool = False  # streamed: chunks carry "usage": null, the last one the usage
    created: int = field(default_factory=lambda: int(time.time()))

    def wrap(self, object_name: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
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

    def closing(self, object_name: str, end: Completed | Failed) -> list[dict[str, Any]]:
        """The chunks that end a stream: the usage (when asked for), or the error."""
        if isinstance(end, Failed):
            return [api_error(end).body()]
        if not self.include_usage:
            return []
        body = self.wrap(object_name, [])
        body["usage"] = usage_body(end)
        return [body]

    def unary(self, object_name: str, choices: list[dict[str, Any]], done: Completed) -> dict[str, Any]:
        body = self.wrap(object_name, choices)
        body["usage"] = usage_body(done)
        return body
