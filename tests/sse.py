"""Strict parsing and checking of the server's Server-Sent Events streams.

The wire format is exactly `data: <json>\\n\\n` per chunk, then `data: [DONE]\\n\\n`.
The checkers below verify the framing rules of both endpoints, validate every chunk
against OpenAI's schema and return what the stream carried (text, finish reason, usage).
Streams of several choices (n > 1, several prompts) send one choice per chunk, each with
its own index: check_chat_choices / check_completion_choices split them by index.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import loopback
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
    with loopback.stream("POST", base_url + path, json=body, timeout=timeout) as response:
        raw = response.read().decode()
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
    assert isinstance(first["system_fingerprint"], str) and first["system_fingerprint"], first


def _one_choice(chunk: dict[str, Any], index: int | None = None) -> dict[str, Any]:
    """The single choice a content chunk carries (every chunk carries exactly one)."""
    assert len(chunk["choices"]) == 1, chunk
    choice = chunk["choices"][0]
    if index is not None:
        assert choice["index"] == index, (index, chunk)
    return choice


@dataclass
class ChoiceStream:
    """What one choice (one `index`) of a stream carried."""

    index: int
    text: str = ""
    finish_reason: str | None = None
    # Completions with echo: the prompt text sent first (also the start of `text`), and
    # with logprobs its tokens' scores, which come in the same chunk.
    echo: str = ""
    echo_logprobs: Any = None
    # (text, logprobs object or None) of every text chunk of this choice, in order.
    pieces: list[tuple[str, Any]] = field(default_factory=list)

    @property
    def logprobs(self) -> list[Any]:
        """The non-null logprobs objects of this choice's text chunks."""
        return [logprobs for _, logprobs in self.pieces if logprobs is not None]


@dataclass
class ChoicesResult:
    """A stream of one or several choices, split by index."""

    choices: list[ChoiceStream]
    usage: dict[str, int] | None
    chunks: list[dict[str, Any]]

    @property
    def texts(self) -> list[str]:
        return [choice.text for choice in self.choices]

    @property
    def finish_reasons(self) -> list[str | None]:
        return [choice.finish_reason for choice in self.choices]


def _add_piece(states: list[ChoiceStream], choice: dict[str, Any], text: Any, chunk: dict[str, Any]) -> None:
    """A text chunk of a choice that has not finished yet. Its text may only be empty
    when the chunk carries the log-probabilities of tokens that added no text (yet)."""
    assert 0 <= choice["index"] < len(states), f"choice index out of range: {chunk}"
    state = states[choice["index"]]
    assert state.finish_reason is None, f"chunk after the choice's finish chunk: {chunk}"
    assert isinstance(text, str), chunk
    logprobs = choice.get("logprobs")
    assert text or logprobs is not None, f"empty text chunk without logprobs: {chunk}"
    state.text += text
    state.pieces.append((text, logprobs))


def _finish(states: list[ChoiceStream], choice: dict[str, Any], chunk: dict[str, Any]) -> None:
    assert 0 <= choice["index"] < len(states), f"choice index out of range: {chunk}"
    state = states[choice["index"]]
    assert state.finish_reason is None, f"second finish chunk for one choice: {chunk}"
    assert choice["finish_reason"] in FINISH_REASONS, chunk
    assert choice.get("logprobs") is None, chunk
    state.finish_reason = choice["finish_reason"]


def _check_all_finished(states: list[ChoiceStream]) -> None:
    unfinished = [state.index for state in states if state.finish_reason is None]
    assert not unfinished, f"choices without a finish chunk: {unfinished}"


def check_chat_choices(chunks: list[dict[str, Any]], count: int = 1, *, include_usage: bool = False) -> ChoicesResult:
    """A chat stream of `count` choices: one role chunk per choice (indices in order),
    then content chunks of any choice, each choice closed by exactly one finish chunk
    with an empty delta and nothing after it, then [the usage chunk]."""
    _check_envelope(chunks, "chat.completion.chunk", "chatcmpl-")
    for chunk in chunks:
        validate(chunk, "CreateChatCompletionStreamResponse")
    content, usage = _split_usage(chunks, include_usage)
    assert len(content) >= 2 * count, "a chat stream needs a role and a finish chunk per choice"
    states = [ChoiceStream(i) for i in range(count)]
    for i, chunk in enumerate(content[:count]):
        opening = _one_choice(chunk, i)
        assert opening["delta"] == {"role": "assistant", "content": ""}, chunk
        assert opening["finish_reason"] is None
    for chunk in content[count:]:
        choice = _one_choice(chunk)
        if choice["finish_reason"] is not None:
            assert choice["delta"] == {}, chunk
            _finish(states, choice, chunk)
        else:
            assert set(choice["delta"]) == {"content"}, chunk
            _add_piece(states, choice, choice["delta"]["content"], chunk)
    _check_all_finished(states)
    return ChoicesResult(states, usage, chunks)


def check_completion_choices(
    chunks: list[dict[str, Any]],
    count: int = 1,
    *,
    include_usage: bool = False,
    echo: list[str | None] | None = None,
) -> ChoicesResult:
    """A completion stream of `count` choices: with `echo`, first one chunk per choice
    (indices in order) carrying its prompt (echo[i], or any non-empty text for None) and,
    when logprobs were asked for, the prompt's scores;
    then text chunks of any choice, each choice closed by exactly one chunk with text ""
    and its finish reason and nothing after it, then [the usage chunk]."""
    _check_envelope(chunks, "text_completion", "cmpl-")
    for chunk in chunks:
        validate_completion_chunk(chunk)
    content, usage = _split_usage(chunks, include_usage)
    states = [ChoiceStream(i) for i in range(count)]
    if echo is not None:
        assert len(echo) == count
        for i, chunk in enumerate(content[:count]):
            choice = _one_choice(chunk, i)
            assert choice["finish_reason"] is None, chunk
            assert isinstance(choice["text"], str) and choice["text"], chunk
            if echo[i] is not None:
                assert choice["text"] == echo[i], (echo[i], chunk)
            states[i].echo = states[i].text = choice["text"]
            states[i].echo_logprobs = choice["logprobs"]
        content = content[count:]
    for chunk in content:
        choice = _one_choice(chunk)
        if choice["finish_reason"] is not None:
            assert choice["text"] == "", chunk
            _finish(states, choice, chunk)
        else:
            _add_piece(states, choice, choice["text"], chunk)
    _check_all_finished(states)
    return ChoicesResult(states, usage, chunks)


def check_chat_stream(chunks: list[dict[str, Any]], *, include_usage: bool = False) -> StreamResult:
    """Role chunk, content chunks, a finish chunk with an empty delta, [usage chunk]."""
    result = check_chat_choices(chunks, 1, include_usage=include_usage)
    (choice,) = result.choices
    assert all(text for text, _ in choice.pieces), "empty content chunk"
    return StreamResult(choice.text, choice.finish_reason, result.usage, chunks)


def check_completion_stream(chunks: list[dict[str, Any]], *, include_usage: bool = False) -> StreamResult:
    """Text chunks (finish_reason null), a chunk with text "" and the reason, [usage chunk]."""
    result = check_completion_choices(chunks, 1, include_usage=include_usage)
    (choice,) = result.choices
    assert all(text for text, _ in choice.pieces), "empty text chunk"
    return StreamResult(choice.text, choice.finish_reason, result.usage, chunks)
