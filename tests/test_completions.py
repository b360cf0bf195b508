"""POST /v3/completions (and /v1/completions): unary and streamed, raw HTTP and SDK."""

from __future__ import annotations

import pytest

from helpers import COMPLETION_PATHS, check_completion_body, complete, completion_body, pick_stop_word
from openai_schema import validate, validate_completion_chunk
from sse import MODEL, check_completion_stream, stream_post

PROMPT = "The capital of France is"
# ignore_eos: the model may end at once on some CPUs; the tests need text to compare.
GREEDY = {"temperature": 0, "max_tokens": 16, "ignore_eos": True}
SDK_GREEDY = {"temperature": 0, "max_tokens": 16, "extra_body": {"ignore_eos": True}}


@pytest.mark.parametrize("path", COMPLETION_PATHS)
def test_unary_length_counts_every_token(server, path):
    result = complete(server.base_url, path, prompt=PROMPT, max_tokens=12, temperature=0, ignore_eos=True, logprobs=1)
    # every token is in the reply, and the reply's text is exactly theirs
    tokens = result.body["choices"][0]["logprobs"]["tokens"]
    assert len(tokens) == 12 and "".join(tokens) == result.text
    assert result.finish_reason == "length"
    assert result.usage["completion_tokens"] == 12
    assert result.usage["total_tokens"] == result.usage["prompt_tokens"] + 12


def test_v1_and_v3_are_the_same_endpoint(server):
    v3, v1 = (complete(server.base_url, path, prompt=PROMPT, **GREEDY) for path in COMPLETION_PATHS)
    assert v3.text == v1.text
    assert v3.usage == v1.usage


def test_greedy_is_deterministic(server):
    first = complete(server.base_url, prompt=PROMPT, logprobs=1, **GREEDY)
    second = complete(server.base_url, prompt=PROMPT, logprobs=1, **GREEDY)
    assert first.text == second.text
    assert first.body["choices"][0]["logprobs"] == second.body["choices"][0]["logprobs"]
    assert first.usage == second.usage
    assert first.body["id"] != second.body["id"]


def test_seed_makes_sampling_reproducible(server):
    params = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 1.0, "seed": 1234, "logprobs": 1}
    first = complete(server.base_url, **params)
    second = complete(server.base_url, **params)
    assert first.text == second.text
    assert first.body["choices"][0]["logprobs"] == second.body["choices"][0]["logprobs"]


def test_prompt_tokens_grow_with_the_prompt(server):
    short = complete(server.base_url, prompt="Hello", max_tokens=1)
    longer = complete(server.base_url, prompt="Hello " * 20, max_tokens=1)
    assert longer.usage["prompt_tokens"] > short.usage["prompt_tokens"] + 10


@pytest.mark.parametrize("path", COMPLETION_PATHS)
@pytest.mark.parametrize("include_usage", [False, True])
def test_stream_matches_unary(server, path, include_usage):
    unary = complete(server.base_url, path, prompt=PROMPT, **GREEDY)
    body = completion_body(PROMPT, stream=True, stream_options={"include_usage": include_usage}, **GREEDY)
    streamed = check_completion_stream(stream_post(server.base_url, path, body), include_usage=include_usage)
    assert streamed.text == unary.text
    assert streamed.finish_reason == unary.finish_reason
    if include_usage:
        assert streamed.usage == unary.usage


def test_stream_without_stream_options_has_no_usage(server):
    body = completion_body(PROMPT, stream=True, **GREEDY)
    streamed = check_completion_stream(stream_post(server.base_url, "/v3/completions", body))
    assert streamed.usage is None
    assert all("usage" not in chunk for chunk in streamed.chunks)


def test_stop_string_unary_excludes_and_stream_includes_it(server):
    full = complete(server.base_url, prompt=PROMPT, max_tokens=32, temperature=0, ignore_eos=True)
    word, at = pick_stop_word(full.text)

    stopped = complete(server.base_url, prompt=PROMPT, max_tokens=32, temperature=0, ignore_eos=True, stop=word)
    assert stopped.text == full.text[:at]
    assert stopped.finish_reason == "stop"
    assert stopped.usage["completion_tokens"] < full.usage["completion_tokens"]

    body = completion_body(PROMPT, max_tokens=32, temperature=0, ignore_eos=True, stop=[word], stream=True)
    streamed = check_completion_stream(stream_post(server.base_url, "/v3/completions", body))
    assert streamed.text == full.text[:at] + word
    assert streamed.finish_reason == "stop"


# ---- through the official SDK --------------------------------------------------------


def test_sdk_unary(client):
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=0, extra_body={"ignore_eos": True}
    )
    check_completion_body(raw.http_response.json())
    completion = raw.parse()
    assert completion.model == MODEL
    assert "".join(completion.choices[0].logprobs.tokens) == completion.choices[0].text
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage.completion_tokens == 8
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 8


def test_sdk_stream_matches_sdk_unary(client):
    unary = client.completions.create(model=MODEL, prompt=PROMPT, **SDK_GREEDY)
    stream = client.completions.create(
        model=MODEL, prompt=PROMPT, stream=True, stream_options={"include_usage": True}, **SDK_GREEDY
    )
    chunks = list(stream)
    for chunk in chunks:
        validate_completion_chunk(chunk.model_dump(exclude_unset=True))
    *content, last = chunks
    assert last.choices == [] and last.usage is not None
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert getattr(last.usage, key) == getattr(unary.usage, key)
    assert "".join(c.choices[0].text for c in content) == unary.choices[0].text
    assert content[-1].choices[0].finish_reason == unary.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in content[:-1])
    validate(unary.model_dump(exclude_unset=True), "CreateCompletionResponse")
