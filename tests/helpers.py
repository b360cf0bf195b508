"""Request builders and response checkers shared by the test modules."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

import loopback
from conftest import sample_value
from openai_schema import validate
from sse import (
    FINISH_REASONS,
    MODEL,
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


# A 429 that says the server could not check an output format now: its grammar
# checker was starved of CPU by other work on the machine, and the same constraint may
# compile the next time.
BUSY_CHECK = "could not check the output format"
# Seconds `post` sends a request again past such 429s: a cap for a checker that never
# gets to run, not a figure to meet.
BUSY_CHECK_PATIENCE = 600


# Seconds a request may take: a cap for a server that hangs (a loaded machine takes
# minutes for what an idle one does in seconds).
REQUEST_CAP = 300


def post(base_url: str, path: str, body: Any = None, *, content: str | bytes | None = None) -> httpx.Response:
    """POST a JSON body (or raw `content`) and return the response. A 429 for a
    constraint check the load starved is sent again after its Retry-After: what comes
    back is what the request itself decides (a 400 for a constraint, a 200), never how
    busy the machine was."""
    give_up = time.monotonic() + BUSY_CHECK_PATIENCE
    while True:
        if content is not None:
            headers = {"content-type": "application/json"}
            reply = loopback.post(base_url + path, content=content, headers=headers, timeout=REQUEST_CAP)
        else:
            reply = loopback.post(base_url + path, json=body, timeout=REQUEST_CAP)
        if reply.status_code != 429 or BUSY_CHECK not in reply.text or time.monotonic() > give_up:
            return reply
        time.sleep(float(reply.headers["retry-after"]))


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


def pick_stop_word(text: str, length: int = 4, after: int | None = None) -> tuple[str, int]:
    """A piece of `text` to use as a stop string, and where it first occurs in `text`.

    Taken from position `after` on (by default after the first third of the text, so
    that stopping there cuts the output short), before the text's last character,
    without leading or trailing blanks; generation stops at its first occurrence, which
    may be earlier, so the index comes from str.find on the whole text.
    """
    start_at = len(text) // 3 if after is None else after
    for start in range(start_at, len(text) - length):
        word = text[start : start + length]
        if word.strip() == word and word.strip():
            return word, text.find(word)
    raise AssertionError(f"no usable stop string in {text!r} (ask for more tokens)")


def metric_value(text: str, name: str, **labels: str) -> float:
    """One sample's value from a Prometheus text exposition."""
    return sample_value(text, name, **labels)


# A chat request that ends with the model's own end-of-sequence token, on any CPU: the
# JSON schema admits only `true` or `false`, after which constrained decoding leaves the
# model nothing to produce but its end token. (Tests that need a natural end use this
# instead of a prompt the model happens to end.)
ENDS_BY_ITSELF: dict[str, Any] = {
    "messages": [{"role": "user", "content": "Is the sky blue? Answer true or false."}],
    "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "boolean"}}},
}


def _innocent_stream(base_url: str, body: dict[str, Any]) -> str | None:
    """A streamed chat request read to its end: its finish reason (None if it had none)."""
    reason = None
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body, timeout=600) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:]).get("choices", []):
                    reason = choice.get("finish_reason") or reason
    return reason


def beside_innocent_streams(server: Any, hostile: Callable[[], None], max_tokens: int = 8, **params: Any) -> None:
    """`hostile()` run while three ordinary chat streams (`params` added to each body) go
    on: all three must end well."""
    finished: list[str | None] = []
    body = chat_body(stream=True, max_tokens=max_tokens, temperature=0, **params)
    streams = [
        threading.Thread(target=lambda: finished.append(_innocent_stream(server.base_url, body))) for _ in range(3)
    ]
    for stream in streams:
        stream.start()
    try:
        hostile()
    finally:
        for stream in streams:
            stream.join(timeout=600)
    assert len(finished) == 3 and all(reason in ("length", "stop") for reason in finished), finished


# How much slower than its baseline /health may answer while something hostile goes on.
HEALTH_SLOWDOWN = 20


def _health_seconds(base_url: str) -> float:
    began = time.perf_counter()
    # A cap for a wait, not a deadline: a frozen event loop fails here instead of hanging.
    assert loopback.get(base_url + "/health", timeout=120).status_code == 200
    return time.perf_counter() - began


def health_stays_fast(server: Any, during: Callable[[], None], baseline_probes: int = 20) -> float:
    """`during()` run in a thread while /health is probed: the slowest probe meanwhile is
    within HEALTH_SLOWDOWN times the slowest of `baseline_probes` probes taken just
    before, in the same conditions (no wall-clock figure: a busy machine slows both).
    Returns the ratio."""
    baseline = max(_health_seconds(server.base_url) for _ in range(baseline_probes))
    failures: list[BaseException] = []

    def run() -> None:
        try:
            during()
        except BaseException as exc:  # noqa: BLE001 (raised again in the test's thread)
            failures.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    slowest = 0.0
    while True:  # one probe at least, however soon `during` ends
        slowest = max(slowest, _health_seconds(server.base_url))
        if not worker.is_alive():
            break
        time.sleep(0.01)
    worker.join()
    if failures:
        raise failures[0]
    ratio = slowest / baseline
    assert ratio <= HEALTH_SLOWDOWN, f"/health took {slowest:.3f} s, {ratio:.0f}x its baseline of {baseline:.3f} s"
    return ratio
