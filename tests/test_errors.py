"""Errors: every bad request gets an OpenAI-shaped JSON error naming the parameter,
never an HTML page or a 5xx, and the server keeps serving afterwards."""

from __future__ import annotations

import json
import re

import openai
import pytest

import loopback
from helpers import CHAT_PATHS, COMPLETION_PATHS, assert_error, chat, chat_body, completion_body, post
from ovtrio.api.errors import REQUEST_ERRORS, api_error
from ovtrio.api.formats import ConstraintError
from ovtrio.embedding.engine import InputError
from ovtrio.errors import FieldError
from ovtrio.images import ImageError
from ovtrio.scheduler import UnsupportedParams
from ovtrio.text.prompts import PromptError
from sse import MODEL

CHAT = CHAT_PATHS[0]
COMPLETIONS = COMPLETION_PATHS[0]
USER = [{"role": "user", "content": "Hi"}]


def chat_without(key: str) -> dict:
    body = chat_body(max_tokens=4)
    del body[key]
    return body


# (id, path, JSON body, expected param, expected code)
BAD_BODIES = [
    ("missing-model", CHAT, chat_without("model"), "model", "missing_required_parameter"),
    ("missing-messages", CHAT, chat_without("messages"), "messages", "missing_required_parameter"),
    ("missing-prompt", COMPLETIONS, {"model": MODEL}, "prompt", "missing_required_parameter"),
    ("empty-messages", CHAT, chat_body() | {"messages": []}, "messages", "invalid_value"),
    ("messages-not-list", CHAT, chat_body() | {"messages": "Hi"}, "messages", "invalid_type"),
    ("content-int", CHAT, chat_body(5), "messages[0].content", "invalid_type"),
    (
        "content-part-image-on-a-text-model",
        CHAT,
        chat_body([{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]),
        "messages[0].content[0].image_url",
        "unsupported_input",
    ),
    (
        "content-part-audio",
        CHAT,
        chat_body([{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]),
        "messages[0].content[0]",
        "invalid_type",
    ),
    ("bad-role", CHAT, chat_body(messages=[{"role": "robot", "content": "Hi"}]), "messages[0].role", "invalid_value"),
    ("max_tokens-string", CHAT, chat_body(max_tokens="5"), "max_tokens", "invalid_type"),
    ("prompt-int", COMPLETIONS, completion_body(123), "prompt", "invalid_type"),
    ("temperature-string", COMPLETIONS, completion_body(temperature="0"), "temperature", "invalid_type"),
    ("ignore_eos-int", CHAT, chat_body(ignore_eos=1), "ignore_eos", "invalid_type"),
    ("stream-string", CHAT, chat_body(stream="true"), "stream", "invalid_type"),
    (
        "include_usage-string",
        CHAT,
        chat_body(stream=True, stream_options={"include_usage": "yes"}),
        "stream_options.include_usage",
        "invalid_type",
    ),
    ("temperature-3", CHAT, chat_body(temperature=3), "temperature", "invalid_value"),
    ("temperature-negative", COMPLETIONS, completion_body(temperature=-0.5), "temperature", "invalid_value"),
    ("top_p-0", CHAT, chat_body(top_p=0), "top_p", "invalid_value"),
    ("top_p-1.5", COMPLETIONS, completion_body(top_p=1.5), "top_p", "invalid_value"),
    ("top_k-0", CHAT, chat_body(top_k=0), "top_k", "invalid_value"),
    ("max_tokens-0", CHAT, chat_body(max_tokens=0), "max_tokens", "invalid_value"),
    ("max_tokens-0-completions", COMPLETIONS, completion_body(max_tokens=0), "max_tokens", "invalid_value"),
    ("max_completion_tokens-0", CHAT, chat_body(max_completion_tokens=0), "max_completion_tokens", "invalid_value"),
    ("seed-negative", CHAT, chat_body(seed=-1), "seed", "invalid_value"),
    ("seed-too-big", COMPLETIONS, completion_body(seed=4294967296), "seed", "invalid_value"),
    ("stop-65", CHAT, chat_body(stop=[f"s{i}" for i in range(65)]), "stop", "invalid_value"),
    ("stop-int", COMPLETIONS, completion_body(stop=5), "stop", "invalid_type"),
    (
        "context-max_tokens",
        CHAT,
        chat_body(max_tokens=100000),
        "max_tokens",
        "context_length_exceeded",
    ),
    (
        "context-max_completion_tokens",
        CHAT,
        chat_body(max_completion_tokens=100000),
        "max_completion_tokens",
        "context_length_exceeded",
    ),
    (
        "context-completions",
        COMPLETIONS,
        completion_body(max_tokens=100000),
        "max_tokens",
        "context_length_exceeded",
    ),
    # A prompt longer than the whole 8192-token context.
    (
        "context-prompt",
        COMPLETIONS,
        completion_body("hello " * 9000, max_tokens=1),
        "prompt",
        "context_length_exceeded",
    ),
    (
        "context-messages",
        CHAT,
        chat_body("hello " * 9000, max_tokens=1),
        "messages",
        "context_length_exceeded",
    ),
]


@pytest.mark.parametrize(
    "path, body, param, code", [case[1:] for case in BAD_BODIES], ids=[case[0] for case in BAD_BODIES]
)
def test_bad_request_names_the_param(server, path, body, param, code):
    assert_error(post(server.base_url, path, body), 400, param=param, code=code)


@pytest.mark.parametrize("path", CHAT_PATHS + COMPLETION_PATHS)
@pytest.mark.parametrize("raw", ["{not json", "", '{"model": "x",}', "[1, 2]", '"a string"', "null", "42"], ids=repr)
def test_body_that_is_not_a_json_object(server, path, raw):
    assert_error(post(server.base_url, path, content=raw), 400, param=None, code="invalid_json")


def test_streaming_request_errors_are_plain_json(server):
    """Validation happens before the stream opens: the error is a JSON 400, not SSE."""
    response = post(server.base_url, CHAT, chat_body(stream=True, temperature=3))
    assert_error(response, 400, param="temperature")


def test_context_error_message_gives_the_numbers(server):
    error = assert_error(post(server.base_url, CHAT, chat_body(max_tokens=100000)), 400, param="max_tokens")
    assert "8192" in error["message"] and "100000" in error["message"]


@pytest.mark.parametrize(
    "path, body, param",
    [
        (COMPLETIONS, completion_body("hello world " * 50_000, max_tokens=1), "prompt"),
        (CHAT, chat_body("hello world " * 50_000, max_tokens=1), "messages"),
    ],
)
def test_an_over_long_prompt_error_states_its_real_length(server, path, body, param):
    """The tokenizer cuts its output at the context length; the error must not."""
    prompt = body.get("prompt") or body["messages"][0]["content"]
    counted = post(server.base_url, "/tokenize", {"model": MODEL, "prompt": prompt}).json()["count"]
    assert counted > 100_000  # 2 tokens per "hello world ", plus any special tokens
    error = assert_error(post(server.base_url, path, body), 400, param=param, code="context_length_exceeded")
    stated = int(re.search(r"the prompt is (\d+) tokens", error["message"]).group(1))
    if path == COMPLETIONS:
        assert stated == counted, error["message"]
    else:  # the chat template adds its own tokens around the message
        assert stated > 100_000, error["message"]


@pytest.mark.parametrize(
    "path, body",
    [(path, chat_body(max_tokens=4)) for path in CHAT_PATHS]
    + [(path, completion_body(max_tokens=4)) for path in COMPLETION_PATHS]
    + [(CHAT, chat_body(max_tokens=4, stream=True))],
)
def test_unknown_model_is_404(server, path, body):
    response = post(server.base_url, path, body | {"model": "gpt-nope"})
    error = assert_error(response, 404, param="model", code="model_not_found")
    assert "gpt-nope" in error["message"]


def test_a_long_unknown_model_name_is_not_sent_back_whole(server):
    name = "gpt-" + "x" * 100_000
    response = post(server.base_url, CHAT, chat_body(max_tokens=4) | {"model": name})
    error = assert_error(response, 404, param="model", code="model_not_found")
    assert name[:200] in error["message"] and len(response.content) < 1_000, len(response.content)


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {"prompt": "Hi", "max_tokens": 1}),
        ("/v1/responses", {"input": "Hi", "max_output_tokens": 16}),
        ("/v1/messages", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}),
        ("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "Hi"}]}),
        ("/v1/embeddings", {"input": "Hi"}),
        ("/v1/rerank", {"query": "Hi", "documents": ["a"]}),
        ("/tokenize", {"prompt": "Hi"}),
        ("/detokenize", {"tokens": [1]}),
        ("/models/load", {}),
        ("/models/unload", {}),
    ],
)
def test_no_route_sends_a_long_unknown_model_name_back_whole(server, path, body):
    name = "gpt-" + "x" * 100_000
    response = post(server.base_url, path, body | {"model": name})
    assert response.status_code == 404, response.text[:300]
    assert name[:100] in response.text and len(response.content) < 1_000, len(response.content)


def test_no_get_sends_a_long_unknown_model_name_back_whole(server):
    name = "gpt-" + "x" * 4_000  # in the path or the query: as long as a request line may be
    for path in (f"/v1/models/{name}", f"/v2/models/{name}/ready", f"/tokenizer_info?model={name}"):
        refused = loopback.get(server.base_url + path, timeout=30)
        assert refused.status_code == 404 and len(refused.content) < 1_000, (path[:20], refused.text[:300])


@pytest.mark.parametrize("path", ["/v1/models/nope", "/v3/models/nope"])
def test_unknown_model_card_is_404(server, path):
    assert_error(loopback.get(server.base_url + path), 404, param="model", code="model_not_found")


@pytest.mark.parametrize("path", ["/nope", "/v1/nope", "/v3/chat/completion"])
def test_unknown_route_is_a_json_404(server, path):
    for method in ("GET", "POST"):
        response = loopback.request(method, server.base_url + path, json={})
        assert_error(response, 404, param=None, code="not_found")
        assert "<html" not in response.text.lower()


@pytest.mark.parametrize("path", CHAT_PATHS + COMPLETION_PATHS)
def test_get_on_a_post_route_is_a_json_405(server, path):
    response = loopback.get(server.base_url + path)
    assert_error(response, 405, param=None, code="method_not_allowed")
    assert "POST" in response.headers.get("allow", "")


# ---- through the official SDK --------------------------------------------------------


def test_sdk_bad_request_error(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=USER, temperature=3)
    assert caught.value.status_code == 400
    assert caught.value.param == "temperature"
    assert caught.value.type == "invalid_request_error"


def test_sdk_bad_request_error_on_stream(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=100000, stream=True)
    assert caught.value.param == "max_tokens"
    assert caught.value.code == "context_length_exceeded"


def test_sdk_not_found_error(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-nope", messages=USER, max_tokens=4)
    assert caught.value.code == "model_not_found"
    assert caught.value.param == "model"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-nope", prompt="Hi", max_tokens=4)
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-nope")


async def test_async_sdk_bad_request_error(async_client):
    with pytest.raises(openai.BadRequestError) as caught:
        await async_client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": 5}],
            max_tokens=4,  # type: ignore[list-item]
        )
    assert caught.value.param == "messages[0].content"


# ---- and the server is unharmed --------------------------------------------------------


def test_server_still_healthy_after_errors(server):
    assert loopback.get(server.base_url + "/health").json() == {"status": "ok"}
    result = chat(server.base_url, max_tokens=4, temperature=0, ignore_eos=True, logprobs=True)
    assert result.usage["completion_tokens"] == 4 == len(result.body["choices"][0]["logprobs"]["content"])
    assert "Traceback" not in server.log_path.read_text()


def test_error_bodies_are_utf8_json(server):
    response = post(server.base_url, COMPLETIONS, completion_body(model="modèle-😀", max_tokens=4))
    error = assert_error(response, 404, param="model")
    assert "modèle-😀" in error["message"]
    assert json.loads(response.content.decode("utf-8")) == response.json()


# ---- errors that name a field, from whichever layer finds them ---------------------------


@pytest.mark.parametrize(
    "error, message, param, code",
    [
        (PromptError("no template", "messages"), "no template", "messages", "invalid_value"),
        (
            ImageError("too big", "messages[0].content[1]", "image_too_large"),
            "too big",
            "messages[0].content[1]",
            "image_too_large",
        ),
        (ConstraintError("bad schema", "response_format"), "bad schema", "response_format", "invalid_value"),
        (InputError("too long", "input[2]"), "too long", "input[2]", "invalid_value"),
        (
            UnsupportedParams("it requires x", "stop"),
            "The engine cannot run this request: it requires x",
            "stop",
            "invalid_value",
        ),
        (
            UnsupportedParams("it requires x"),
            "The engine cannot run this request: it requires x",
            None,
            "invalid_value",
        ),
    ],
    ids=["prompt", "image", "constraint", "encoder-input", "engine-settings", "engine-settings-unnamed"],
)
def test_a_field_error_is_a_400_naming_its_field(error, message, param, code):
    assert isinstance(error, FieldError)
    assert isinstance(error, REQUEST_ERRORS)
    answer = api_error(error)
    assert (answer.status, answer.body()) == (
        400,
        {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}},
    )
