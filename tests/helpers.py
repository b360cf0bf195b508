"""Request builders and response checkers shared by the test modules."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import httpx

from openai_schema import validate
from sse import (
    MODEL,
    FINISH_REASONS,
    ChoicesResult,
    check_chat_choices,
    check_completion_choices,
    check_usage,
    stream_post,
)

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
    """A unary response: the first choice's text and finish reason, the usage, the body,
    and the texts and finish reasons of all choices (in index order)."""

    text: str
    finish_reason: str
    usage: dict[str, int]
    body: dict[str, Any]
    texts: list[str] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)


def expected_choices(body: dict[str, Any]) -> int:
    """How many choices a request asks for: n per prompt (a completions prompt that is a
    list of strings or of token-id lists is several prompts)."""
    n = body.get("n", 1)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        return n * len(prompt)
    return n


def _check_body(body: dict[str, Any], schema: str, object_name: str, id_prefix: str, choices: int) -> None:
    validate(body, schema)
    assert body["object"] == object_name
    assert body["id"].startswith(id_prefix)
    assert body["model"] == MODEL
    assert isinstance(body["system_fingerprint"], str) and body["system_fingerprint"], body
    assert [choice["index"] for choice in body["choices"]] == list(range(choices)), body["choices"]
    for choice in body["choices"]:
        assert choice["finish_reason"] in FINISH_REASONS
    check_usage(body["usage"])


def check_chat_body(body: dict[str, Any], choices: int = 1) -> Unary:
    """Schema-valid chat.completion with `choices` assistant choices; returns its parts."""
    _check_body(body, "CreateChatCompletionResponse", "chat.completion", "chatcmpl-", choices)
    for choice in body["choices"]:
        assert choice["message"]["role"] == "assistant"
        assert isinstance(choice["message"]["content"], str)
    texts = [choice["message"]["content"] for choice in body["choices"]]
    reasons = [choice["finish_reason"] for choice in body["choices"]]
    return Unary(texts[0], reasons[0], body["usage"], body, texts, reasons)


def check_completion_body(body: dict[str, Any], choices: int = 1) -> Unary:
    """Schema-valid text_completion with `choices` choices; returns its parts."""
    _check_body(body, "CreateCompletionResponse", "text_completion", "cmpl-", choices)
    for choice in body["choices"]:
        assert isinstance(choice["text"], str)
    texts = [choice["text"] for choice in body["choices"]]
    reasons = [choice["finish_reason"] for choice in body["choices"]]
    return Unary(texts[0], reasons[0], body["usage"], body, texts, reasons)


def chat(base_url: str, path: str = CHAT_PATHS[0], **params: Any) -> Unary:
    body = chat_body(**params)
    response = post(base_url, path, body)
    assert response.status_code == 200, response.text
    return check_chat_body(response.json(), expected_choices(body))


def complete(base_url: str, path: str = COMPLETION_PATHS[0], **params: Any) -> Unary:
    body = completion_body(**params)
    response = post(base_url, path, body)
    assert response.status_code == 200, response.text
    return check_completion_body(response.json(), expected_choices(body))


def warm_up(base_url: str, path: str, **params: Any) -> None:
    """Run a short request with these messages / this prompt once, so that the engine's
    prefix cache holds the prompt before outputs are compared.

    The engine computes slightly different logits for a prompt whose KV blocks it finds
    in its prefix cache than for one it computes afresh (see
    test_sampling_params.py::test_output_does_not_depend_on_the_prefix_cache), so
    requests whose texts are compared must all meet the cache in the same state: after
    one request of 2+ tokens, the prompt's full blocks stay cached and nothing else of it
    is reused.
    """
    keep = {key: params[key] for key in ("messages", "content", "prompt", "nvext") if key in params}
    body = chat_body(**keep) if "chat" in path else completion_body(**keep)
    response = post(base_url, path, body | {"max_tokens": 2, "temperature": 0})
    assert response.status_code == 200, response.text


def _include_usage(body: dict[str, Any]) -> bool:
    return bool((body.get("stream_options") or {}).get("include_usage"))


def chat_stream(base_url: str, path: str = CHAT_PATHS[0], **params: Any) -> ChoicesResult:
    """A streamed chat request (raw httpx), checked chunk by chunk, split by choice."""
    body = chat_body(stream=True, **params)
    chunks = stream_post(base_url, path, body)
    return check_chat_choices(chunks, expected_choices(body), include_usage=_include_usage(body))


def complete_stream(base_url: str, path: str = COMPLETION_PATHS[0], **params: Any) -> ChoicesResult:
    """A streamed completions request (raw httpx), checked chunk by chunk, split by
    choice. With echo, string prompts must come back first, verbatim."""
    body = completion_body(stream=True, **params)
    chunks = stream_post(base_url, path, body)
    echo = None
    if body.get("echo"):
        prompt = body["prompt"]
        if isinstance(prompt, str):
            prompts: list[str | None] = [prompt]
        elif isinstance(prompt[0], int):  # one prompt of token ids: its text is not known here
            prompts = [None]
        else:
            prompts = [p if isinstance(p, str) else None for p in prompt]
        echo = [p for p in prompts for _ in range(body.get("n", 1))]
    return check_completion_choices(chunks, expected_choices(body), include_usage=_include_usage(body), echo=echo)


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


# A conversation the model ends by itself (end-of-sequence) after about 9 tokens.
SHORT_ANSWER = [
    {"role": "user", "content": "My name is Alice."},
    {"role": "assistant", "content": "Nice to meet you, Alice!"},
    {"role": "user", "content": "What is my name?"},
]
