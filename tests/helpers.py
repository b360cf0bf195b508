"""Request builders and response checkers shared by the test modules."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import httpx

from openai_schema import validate
from sse import MODEL, FINISH_REASONS, check_usage

ERROR_KEYS = {"message", "type", "param", "code"}

CHAT_PATHS = ("/v3/chat/completions", "/v1/chat/completions")
COMPLETION_PATHS = ("/v3/completions", "/v1/completions")


def chat_body(content: Any = "Hi", **params: Any) -> dict[str, Any]:
    """A chat request with one user message (or `messages=` given explicitly)."""
    messages = params.pop("messages", None) or [{"role": "user", "content": content}]
    return {"model": MODEL, "messages": messages, **params}


def completion_body(prompt: str = "The capital of France is", **params: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, **params}


def post(base_url: str, path: str, body: Any = None, *, content: str | bytes | None = None) -> httpx.Response:
    """POST a JSON body (or raw `content`) and return the response."""
    if content is not None:
        return httpx.post(base_url + path, content=content, headers={"content-type": "application/json"}, timeout=60)
    return httpx.post(base_url + path, json=body, timeout=60)


@dataclass
class Unary:
    text: str
    finish_reason: str
    usage: dict[str, int]
    body: dict[str, Any]


def check_chat_body(body: dict[str, Any]) -> Unary:
    """Schema-valid chat.completion with one assistant choice; returns its parts."""
    validate(body, "CreateChatCompletionResponse")
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert body["model"] == MODEL
    assert len(body["choices"]) == 1
    choice = body["choices"][0]
    assert choice["index"] == 0
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in FINISH_REASONS
    check_usage(body["usage"])
    return Unary(choice["message"]["content"], choice["finish_reason"], body["usage"], body)


def check_completion_body(body: dict[str, Any]) -> Unary:
    """Schema-valid text_completion with one choice; returns its parts."""
    validate(body, "CreateCompletionResponse")
    assert body["object"] == "text_completion"
    assert body["id"].startswith("cmpl-")
    assert body["model"] == MODEL
    assert len(body["choices"]) == 1
    choice = body["choices"][0]
    assert choice["index"] == 0
    assert isinstance(choice["text"], str)
    assert choice["finish_reason"] in FINISH_REASONS
    check_usage(body["usage"])
    return Unary(choice["text"], choice["finish_reason"], body["usage"], body)


def chat(base_url: str, path: str = CHAT_PATHS[0], **params: Any) -> Unary:
    response = post(base_url, path, chat_body(**params))
    assert response.status_code == 200, response.text
    return check_chat_body(response.json())


def complete(base_url: str, path: str = COMPLETION_PATHS[0], **params: Any) -> Unary:
    response = post(base_url, path, completion_body(**params))
    assert response.status_code == 200, response.text
    return check_completion_body(response.json())


def assert_error(
    response: httpx.Response,
    status: int,
    *,
    param: str | None,
    code: str | None = None,
    type: str = "invalid_request_error",
) -> dict[str, Any]:
    """An OpenAI-shaped JSON error with the given status, param and (optionally) code."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json"), response.headers["content-type"]
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == ERROR_KEYS, error
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] == type, error
    assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    return error


def pick_stop_word(text: str) -> tuple[str, int]:
    """A word from the second half of `text`, and where it first occurs in `text`.

    The first occurrence may sit inside an earlier word; that is where generation
    stops, so the index is computed with str.find on the whole text.
    """
    words = re.findall(r"[A-Za-z]{4,}", text)
    middle = len(text) // 3
    for word in words:
        at = text.find(word)
        if at >= middle:
            return word, at
    raise AssertionError(f"no usable stop word in {text!r}")


def metric_value(text: str, name: str) -> float:
    """One sample's value from a Prometheus text exposition."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)
