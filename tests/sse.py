"""Strict parsing and checking of the server's Server-Sent Events streams.

The wire format is exactly `data: <json>\\n\\n` per chunk, then `data: [DONE]\\n\\n`.
The checkers below verify the framing rules of both endpoints, validate every chunk
against OpenAI's schema and return what the stream carried (text, finish reason, usage).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

from openai_schema import validate, validate_completion_chunk

MODEL = "SmolLM2-135M-Instruct"
DONE = "[DONE]"
FINISH_REASONS = {"stop", "length"}


def parse_sse(raw: str) -> list[dict[str, Any]]:
    """The JSON chunks of a complete SSE body; asserts the framing and the final [DONE]."""
    assert raw.endswith("\n\n"), f"stream does not end with a blank line: {raw[-80:]!r}"
    payloads = []
    for block in raw[:-2].split("\n\n"):
        assert block.startswith("data: "), f"not a data event: {block[:80]!r}"
        assert "\n" not in block, f"event spans several lines: {block[:80]!r}"
        payloads.append(block[len("data: ") :])
    assert payloads[-1] == DONE, f"stream does not end with [DONE]: {payloads[-1][:80]!r}"
    assert payloads.count(DONE) == 1, "[DONE] sent more than once"
    return [json.loads(payload) for payload in payloads[:-1]]


def stream_post(base_url: str, path: str, body: dict[str, Any], timeout: float = 60) -> list[dict[str, Any]]:
    """POST a streaming request with raw httpx; returns the parsed chunks."""
    with httpx.stream("POST", base_url + path, json=body, timeout=timeout) as response:
        raw = response.read().decode()
    assert response.status_code == 200, raw
    assert response.headers["content-type"].startswith("text/event-stream")
    return parse_sse(raw)


async def astream_post(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """stream_post for an httpx.AsyncClient (works under trio)."""
    async with http.stream("POST", path, json=body) as response:
        raw = (await response.aread()).decode()
    assert response.status_code == 200, raw
    assert response.headers["content-type"].startswith("text/event-stream")
    return parse_sse(raw)


@dataclass
class StreamResult:
    text: str
    finish_reason: str
    usage: dict[str, int] | None
    chunks: list[dict[str, Any]]


def check_usage(usage: dict[str, Any]) -> None:
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert isinstance(usage[key], int), usage
    assert usage["prompt_tokens"] > 0
    assert usage["completion_tokens"] >= 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def _split_usage(chunks: list[dict[str, Any]], include_usage: bool) -> tuple[list[dict[str, Any]], Any]:
    """Content chunks, and the usage of the final usage chunk when it was asked for."""
    if not include_usage:
        for chunk in chunks:
            assert chunk.get("usage") is None, chunk
        return chunks, None
    *content, last = chunks
    assert last["choices"] == [], f"last chunk before [DONE] is not the usage chunk: {last}"
    assert isinstance(last["usage"], dict), last
    check_usage(last["usage"])
    for chunk in content:
        assert "usage" in chunk and chunk["usage"] is None, chunk
    return content, last["usage"]


def _check_envelope(chunks: list[dict[str, Any]], object_name: str, id_prefix: str) -> None:
    assert chunks, "stream carried no chunks"
    first = chunks[0]
    assert first["id"].startswith(id_prefix)
    for chunk in chunks:
        assert chunk["object"] == object_name
        assert chunk["model"] == MODEL
        # Every chunk of one response shares id, created and fingerprint.
        for key in ("id", "created", "system_fingerprint"):
            assert chunk[key] == first[key], (key, chunk)


def _only_choice(chunk: dict[str, Any]) -> dict[str, Any]:
    assert len(chunk["choices"]) == 1, chunk
    choice = chunk["choices"][0]
    assert choice["index"] == 0
    return choice


def check_chat_stream(chunks: list[dict[str, Any]], *, include_usage: bool = False) -> StreamResult:
    """Role chunk, content chunks, a finish chunk with an empty delta, [usage chunk]."""
    _check_envelope(chunks, "chat.completion.chunk", "chatcmpl-")
    for chunk in chunks:
        validate(chunk, "CreateChatCompletionStreamResponse")
    content, usage = _split_usage(chunks, include_usage)
    assert len(content) >= 2, "a chat stream needs at least the role and the finish chunk"
    opening = _only_choice(content[0])
    assert opening["delta"] == {"role": "assistant", "content": ""}
    assert opening["finish_reason"] is None
    finish = _only_choice(content[-1])
    assert finish["delta"] == {}, finish
    assert finish["finish_reason"] in FINISH_REASONS
    parts = []
    for chunk in content[1:-1]:
        choice = _only_choice(chunk)
        assert choice["finish_reason"] is None, chunk
        assert set(choice["delta"]) == {"content"}, chunk
        assert isinstance(choice["delta"]["content"], str) and choice["delta"]["content"], chunk
        parts.append(choice["delta"]["content"])
    return StreamResult("".join(parts), finish["finish_reason"], usage, chunks)


def check_completion_stream(chunks: list[dict[str, Any]], *, include_usage: bool = False) -> StreamResult:
    """Text chunks (finish_reason null), a chunk with text "" and the reason, [usage chunk]."""
    _check_envelope(chunks, "text_completion", "cmpl-")
    for chunk in chunks:
        validate_completion_chunk(chunk)
    content, usage = _split_usage(chunks, include_usage)
    assert content, "a completion stream needs at least the finish chunk"
    finish = _only_choice(content[-1])
    assert finish["text"] == ""
    assert finish["finish_reason"] in FINISH_REASONS
    parts = []
    for chunk in content[:-1]:
        choice = _only_choice(chunk)
        assert choice["finish_reason"] is None, chunk
        assert isinstance(choice["text"], str) and choice["text"], chunk
        parts.append(choice["text"])
    return StreamResult("".join(parts), finish["finish_reason"], usage, chunks)
