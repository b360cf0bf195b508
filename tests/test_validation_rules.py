"""Both sides of every validation rule: boundary values are accepted (a schema-valid 200,
unary and streamed), values just outside are a 400 in OpenAI's error shape naming the
parameter; fields that change nothing are accepted, fields the server cannot honour are
refused by name; context-length limits; and the server-wide --max-tokens-limit."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from helpers import (
    CHAT_PATHS,
    COMPLETION_PATHS,
    ENDS_BY_ITSELF,
    assert_error,
    chat,
    chat_body,
    chat_stream,
    complete,
    complete_stream,
    completion_body,
    expected_choices,
    post,
)
from in_process import in_process_server
from sse import MODEL

CHAT = CHAT_PATHS[0]
COMPLETIONS = COMPLETION_PATHS[0]
PROMPT = "Validation rules are"
CONTEXT = 8192


def body_for(path: str, **params: Any) -> dict[str, Any]:
    return chat_body("Hi", **params) if path == CHAT else completion_body(PROMPT, **params)


def case_id(case: tuple) -> str:
    path, params = case[0], case[1]
    endpoint = "chat" if path == CHAT else "cmpl"
    return endpoint + ":" + ",".join(f"{k}={v!r}"[:40] for k, v in params.items())


# ---- accepted boundary values -----------------------------------------------------------------

ACCEPTED = [
    (COMPLETIONS, {"temperature": 0}),
    (COMPLETIONS, {"temperature": 2}),
    (CHAT, {"temperature": 2.0}),
    (COMPLETIONS, {"top_p": 1}),
    (CHAT, {"top_p": 1e-9}),
    (COMPLETIONS, {"min_p": 0}),
    (COMPLETIONS, {"min_p": 0.999}),
    (COMPLETIONS, {"top_k": -1}),
    (CHAT, {"top_k": 1}),
    (COMPLETIONS, {"top_k": 100000}),
    (COMPLETIONS, {"repetition_penalty": 2}),
    (CHAT, {"repetition_penalty": 0.01}),
    (COMPLETIONS, {"frequency_penalty": -2, "presence_penalty": 2}),
    (CHAT, {"frequency_penalty": 2.0, "presence_penalty": -2.0}),
    (COMPLETIONS, {"seed": 0}),
    (CHAT, {"seed": 4294967295}),
    (COMPLETIONS, {"n": 16, "seed": 4294967295, "temperature": 1}),
    (CHAT, {"n": 2, "best_of": 2}),
    (COMPLETIONS, {"best_of": 16}),
    (COMPLETIONS, {"best_of": 3, "n": 3, "diversity_penalty": 0.0, "length_penalty": 0.0}),
    (CHAT, {"best_of": 2, "diversity_penalty": 100.0, "length_penalty": -3.5}),
    (COMPLETIONS, {"stop": ["a", "b", "c", "d"]}),
    (CHAT, {"stop": "x"}),
    (CHAT, {"stop": []}),
    (COMPLETIONS, {"stop": None, "stop_token_ids": []}),
    (COMPLETIONS, {"stop_token_ids": [0, 49151]}),
    (CHAT, {"min_tokens": 0}),
    (COMPLETIONS, {"min_tokens": 3, "max_tokens": 3}),
    (CHAT, {"min_tokens": 3, "max_completion_tokens": 3, "max_tokens": 2}),
    (COMPLETIONS, {"logprobs": 0}),
    (COMPLETIONS, {"logprobs": 1, "echo": True}),
    (CHAT, {"logprobs": True, "top_logprobs": 0}),
    (CHAT, {"logprobs": False}),
    (COMPLETIONS, {"max_tokens": 1}),
    (CHAT, {"max_completion_tokens": 1}),
    (CHAT, {"ignore_eos": False, "skip_special_tokens": False, "include_stop_str_in_output": True}),
    (CHAT, {"nvext": {"top_k": -1, "repetition_penalty": 2.0}}),
    (COMPLETIONS, {"nvext": {"top_k": 1, "greedy_sampling": False, "ignore_eos": False}}),
    (CHAT, {"nvext": {"use_raw_prompt": False, "annotations": []}}),
    (COMPLETIONS, {"nvext": {}}),
    # nvext.top_k replaces top_k, so the top-level 0 is never used
    (CHAT, {"top_k": 0, "nvext": {"top_k": 5}}),
]


@pytest.mark.parametrize("path, params", ACCEPTED, ids=[case_id(c) for c in ACCEPTED])
@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_boundary_values_are_accepted(server, path, params, stream):
    params = {"max_tokens": 3, **params}
    if path == CHAT:
        result = (chat_stream if stream else chat)(server.base_url, content="Hi", **params)
    else:
        result = (complete_stream if stream else complete)(server.base_url, prompt=PROMPT, **params)
    count = expected_choices(body_for(path, **params))
    assert len(result.texts) == count  # the helpers check every index, body and chunk
    if not stream:
        limit = params.get("max_completion_tokens", params["max_tokens"])
        assert result.usage["completion_tokens"] <= count * limit


# ---- rejected values -----------------------------------------------------------------------------

# (path, params, the param the 400 names); max_tokens is 3 unless given (None: omitted)
REJECTED = [
    (COMPLETIONS, {"temperature": -0.01}, "temperature"),
    (CHAT, {"temperature": 2.01}, "temperature"),
    (COMPLETIONS, {"top_p": 0}, "top_p"),
    (CHAT, {"top_p": 1.0001}, "top_p"),
    (COMPLETIONS, {"top_p": -0.5}, "top_p"),
    (COMPLETIONS, {"min_p": 1}, "min_p"),
    (CHAT, {"min_p": -0.01}, "min_p"),
    (COMPLETIONS, {"top_k": 0}, "top_k"),
    (CHAT, {"top_k": -2}, "top_k"),
    (COMPLETIONS, {"repetition_penalty": 0}, "repetition_penalty"),
    (CHAT, {"repetition_penalty": 2.01}, "repetition_penalty"),
    (COMPLETIONS, {"repetition_penalty": -1}, "repetition_penalty"),
    (COMPLETIONS, {"frequency_penalty": -2.01}, "frequency_penalty"),
    (CHAT, {"frequency_penalty": 2.01}, "frequency_penalty"),
    (COMPLETIONS, {"presence_penalty": 2.01}, "presence_penalty"),
    (CHAT, {"presence_penalty": -2.01}, "presence_penalty"),
    (COMPLETIONS, {"seed": -1}, "seed"),
    (CHAT, {"seed": 4294967296}, "seed"),
    (COMPLETIONS, {"n": 0}, "n"),
    (CHAT, {"n": 17}, "n"),
    (COMPLETIONS, {"best_of": 0}, "best_of"),
    (COMPLETIONS, {"best_of": 17}, "best_of"),
    (COMPLETIONS, {"best_of": 1, "n": 2}, "best_of"),
    (CHAT, {"best_of": 3, "n": 4}, "best_of"),
    (COMPLETIONS, {"best_of": 2, "diversity_penalty": -0.1}, "diversity_penalty"),
    (COMPLETIONS, {"length_penalty": "long"}, "length_penalty"),
    (COMPLETIONS, {"stop": [f"s{i}" for i in range(65)]}, "stop"),
    (CHAT, {"stop": [f"s{i}" for i in range(65)]}, "stop"),
    (COMPLETIONS, {"stop_token_ids": [-1]}, "stop_token_ids[0]"),
    (CHAT, {"stop_token_ids": [28, -5]}, "stop_token_ids[1]"),
    (COMPLETIONS, {"min_tokens": -1}, "min_tokens"),
    (COMPLETIONS, {"min_tokens": 4, "max_tokens": 3}, "min_tokens"),
    (CHAT, {"min_tokens": 4, "max_tokens": 3}, "min_tokens"),
    (CHAT, {"min_tokens": 4, "max_completion_tokens": 3, "max_tokens": 10}, "min_tokens"),
    (COMPLETIONS, {"min_tokens": CONTEXT, "max_tokens": None}, "min_tokens"),
    (CHAT, {"min_tokens": CONTEXT, "max_tokens": None}, "min_tokens"),
    (COMPLETIONS, {"logprobs": 21}, "logprobs"),
    (COMPLETIONS, {"logprobs": -1}, "logprobs"),
    (COMPLETIONS, {"logprobs": True}, "logprobs"),
    (CHAT, {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    (CHAT, {"top_logprobs": 0}, "top_logprobs"),
    (CHAT, {"logprobs": False, "top_logprobs": 0}, "top_logprobs"),
    (CHAT, {"logprobs": 1}, "logprobs"),
    (COMPLETIONS, {"nvext": {"top_k": 0}}, "nvext.top_k"),
    (CHAT, {"top_k": 5, "nvext": {"top_k": -3}}, "nvext.top_k"),
    (COMPLETIONS, {"nvext": {"repetition_penalty": 3}}, "nvext.repetition_penalty"),
    (CHAT, {"nvext": {"repetition_penalty": 0}}, "nvext.repetition_penalty"),
    (CHAT, {"nvext": {"ignore_eos": "yes"}}, "nvext.ignore_eos"),
    (COMPLETIONS, {"nvext": {"greedy_sampling": 1}}, "nvext.greedy_sampling"),
    (COMPLETIONS, {"nvext": "greedy"}, "nvext"),
    (COMPLETIONS, {"echo": "yes"}, "echo"),
    (CHAT, {"skip_special_tokens": 0}, "skip_special_tokens"),
    (CHAT, {"include_stop_str_in_output": "false"}, "include_stop_str_in_output"),
]


@pytest.mark.parametrize("path, params, param", REJECTED, ids=[case_id(c) for c in REJECTED])
@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_out_of_range_values_are_400_naming_the_param(server, path, params, param, stream):
    body = body_for(path, **{"max_tokens": 3, **params}, stream=stream)
    if body["max_tokens"] is None:
        del body["max_tokens"]
    error = assert_error(post(server.base_url, path, body), 400, param=param)
    assert error["code"] in {"invalid_value", "invalid_type"}
    assert param.split(".")[-1].split("[")[0] in error["message"]


def test_include_stop_str_in_output_false_is_refused_when_streaming(server):
    for path in (CHAT, COMPLETIONS):
        body = body_for(path, max_tokens=3, stop="x", stream=True, include_stop_str_in_output=False)
        assert_error(post(server.base_url, path, body), 400, param="include_stop_str_in_output", code="invalid_value")
        # ... and accepted unary, where the stop string is simply left out
        unary = body_for(path, max_tokens=3, stop="x", include_stop_str_in_output=False)
        assert post(server.base_url, path, unary).status_code == 200


# ---- through the SDK ---------------------------------------------------------------------------


def test_sdk_best_of_below_n(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt=PROMPT, n=3, best_of=2, max_tokens=3)
    assert caught.value.param == "best_of"
    assert caught.value.code == "invalid_value"


def test_sdk_logprobs_above_twenty(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt=PROMPT, logprobs=21, max_tokens=3, stream=True)
    assert caught.value.param == "logprobs"


def test_sdk_top_logprobs(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], logprobs=True, top_logprobs=21, max_tokens=3
        )
    assert caught.value.param == "top_logprobs"


def test_sdk_extra_body_top_k_zero(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3, extra_body={"top_k": 0}
        )
    assert caught.value.param == "top_k"


def test_sdk_nvext_top_k_zero(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, extra_body={"nvext": {"top_k": 0}})
    assert caught.value.param == "nvext.top_k"


def test_sdk_min_tokens_over_max_completion_tokens(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi"}],
            max_completion_tokens=3,
            extra_body={"min_tokens": 5},
        )
    assert caught.value.param == "min_tokens"


# ---- fields accepted and ignored, fields refused ------------------------------------------------------

IGNORED = [
    (CHAT, {"user": "user-1234"}),
    (CHAT, {"metadata": {"team": "qa", "run": "7"}}),
    (CHAT, {"service_tier": "auto"}),
    (CHAT, {"store": False}),
    (CHAT, {"store": True}),
    (CHAT, {"logit_bias": {}}),
    (COMPLETIONS, {"user": "user-1234"}),
    (COMPLETIONS, {"logit_bias": {}}),
    (COMPLETIONS, {"suffix": None}),
    (COMPLETIONS, {"suffix": ""}),
    (COMPLETIONS, {"prompt_logprobs": None}),
    (CHAT, {"functions": []}),
    (CHAT, {"function_call": None}),
]


@pytest.fixture(scope="module")
def greedy_reference(server) -> dict[str, str]:
    return {
        CHAT: chat(server.base_url, content="Hi", max_tokens=6, temperature=0).text,
        COMPLETIONS: complete(server.base_url, prompt=PROMPT, max_tokens=6, temperature=0).text,
    }


@pytest.mark.parametrize("path, params", IGNORED, ids=[case_id(c) for c in IGNORED])
def test_fields_that_change_nothing_are_accepted(server, greedy_reference, path, params):
    if path == CHAT:
        result = chat(server.base_url, content="Hi", max_tokens=6, temperature=0, **params)
    else:
        result = complete(server.base_url, prompt=PROMPT, max_tokens=6, temperature=0, **params)
    assert result.text == greedy_reference[path]


def test_ignored_fields_through_the_sdk(client):
    params = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
        "temperature": 0,
        "logprobs": True,
        "extra_body": {"ignore_eos": True},
    }
    ignored = {"user": "u-1", "metadata": {"k": "v"}, "service_tier": "auto", "store": False, "logit_bias": {}}
    completion = client.chat.completions.create(**params, **ignored)
    plain = client.chat.completions.create(**params)
    assert completion.choices[0].message.role == "assistant"
    # accepted, and they change nothing
    assert completion.choices[0].message.content == plain.choices[0].message.content
    assert completion.choices[0].logprobs == plain.choices[0].logprobs
    assert completion.usage == plain.usage


REFUSED = [
    (CHAT, {"logit_bias": {"50": 1}}, "logit_bias"),
    (COMPLETIONS, {"logit_bias": {"50": -100}}, "logit_bias"),
    (COMPLETIONS, {"suffix": " and that is all."}, "suffix"),
    (CHAT, {"functions": [{"name": "f", "parameters": {"type": "object"}}]}, "functions"),
    (CHAT, {"function_call": "auto"}, "function_call"),
    (CHAT, {"function_call": {"name": "f"}}, "function_call"),
    (CHAT, {"prompt_logprobs": 0}, "prompt_logprobs"),
]


@pytest.mark.parametrize("path, params, param", REFUSED, ids=[case_id(c) for c in REFUSED])
@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_fields_the_server_cannot_honour_are_refused_by_name(server, path, params, param, stream):
    body = body_for(path, max_tokens=3, stream=stream, **params)
    error = assert_error(post(server.base_url, path, body), 400, param=param, code="unsupported_parameter")
    assert param in error["message"]


def test_sdk_suffix_is_refused(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt=PROMPT, suffix="!", max_tokens=3)
    assert caught.value.param == "suffix"
    assert caught.value.code == "unsupported_parameter"


# ---- context length ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, params, param",
    [
        (COMPLETIONS, {"max_tokens": CONTEXT}, "max_tokens"),
        (CHAT, {"max_tokens": CONTEXT}, "max_tokens"),
        (CHAT, {"max_completion_tokens": CONTEXT, "max_tokens": 3}, "max_completion_tokens"),
    ],
)
@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_max_tokens_beyond_the_context_is_400(server, path, params, param, stream):
    body = body_for(path, stream=stream, **params)
    error = assert_error(post(server.base_url, path, body), 400, param=param, code="context_length_exceeded")
    assert str(CONTEXT) in error["message"]


def test_max_tokens_exactly_filling_the_context(server):
    # The schema ends generation after a few tokens, well before max_tokens.
    params = {**ENDS_BY_ITSELF, "temperature": 0}
    prompt_tokens = chat(server.base_url, max_tokens=2, **params).usage["prompt_tokens"]
    room = CONTEXT - prompt_tokens
    result = chat(server.base_url, max_tokens=room, **params)
    assert result.finish_reason == "stop" and json.loads(result.text) in (True, False)
    too_many = post(server.base_url, CHAT, chat_body(max_tokens=room + 1, **params))
    error = assert_error(too_many, 400, param="max_tokens", code="context_length_exceeded")
    assert str(prompt_tokens) in error["message"] and str(room + 1) in error["message"]


@pytest.mark.parametrize(
    "length, max_tokens, param",
    [(8200, 3, "prompt"), (CONTEXT, 3, "prompt"), (CONTEXT, None, "prompt"), (CONTEXT - 1, 2, "max_tokens")],
)
@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_token_prompt_longer_than_the_context_is_400(server, length, max_tokens, param, stream):
    body = completion_body([504] * length, stream=stream)
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    error = assert_error(post(server.base_url, COMPLETIONS, body), 400, param=param, code="context_length_exceeded")
    assert str(length) in error["message"]


def test_several_prompts_are_limited_by_the_longest(server):
    body = completion_body([[504] * 10, [504] * 8200], max_tokens=3)
    assert_error(post(server.base_url, COMPLETIONS, body), 400, param="prompt", code="context_length_exceeded")


# ---- --max-tokens-limit -----------------------------------------------------------------------------------


# The cap is the API layer's: the engine is the fake one.
capped = in_process_server("capped", "--max-tokens-limit", "7")


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_cap_is_the_default_max_tokens(capped, path):
    run = chat if path == CHAT else complete
    prompt = {"content": "Hi"} if path == CHAT else {"prompt": PROMPT}
    forced = run(capped.base_url, ignore_eos=True, **prompt)
    assert forced.usage["completion_tokens"] == 7 and forced.finish_reason == "length"
    natural = run(capped.base_url, temperature=1.0, **prompt)
    assert natural.usage["completion_tokens"] <= 7


def test_cap_applies_to_streams_and_to_every_choice(capped):
    streamed = complete_stream(
        capped.base_url, prompt=PROMPT, n=2, ignore_eos=True, stream_options={"include_usage": True}
    )
    assert streamed.finish_reasons == ["length", "length"]
    assert streamed.usage["completion_tokens"] == 14
    chat_streamed = chat_stream(capped.base_url, content="Hi", ignore_eos=True, stream_options={"include_usage": True})
    assert chat_streamed.usage["completion_tokens"] == 7


@pytest.mark.parametrize("max_tokens", [1, 5, 7])
def test_max_tokens_up_to_the_cap_is_fine(capped, max_tokens):
    result = complete(capped.base_url, prompt=PROMPT, max_tokens=max_tokens, ignore_eos=True)
    assert result.usage["completion_tokens"] == max_tokens


@pytest.mark.parametrize(
    "path, params, param",
    [
        (COMPLETIONS, {"max_tokens": 8}, "max_tokens"),
        (CHAT, {"max_tokens": 8}, "max_tokens"),
        (CHAT, {"max_completion_tokens": 8, "max_tokens": 2}, "max_completion_tokens"),
        (COMPLETIONS, {"max_tokens": 100000}, "max_tokens"),
        (COMPLETIONS, {"min_tokens": 8}, "min_tokens"),
        (CHAT, {"min_tokens": 8}, "min_tokens"),
    ],
)
@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_above_the_cap_is_400(capped, path, params, param, stream):
    error = assert_error(post(capped.base_url, path, body_for(path, stream=stream, **params)), 400, param=param)
    if param != "min_tokens":
        assert "7" in error["message"]


def test_sdk_above_the_cap(capped):
    with openai.OpenAI(base_url=capped.v1, api_key="unused", max_retries=0, timeout=60) as sdk:
        with pytest.raises(openai.BadRequestError) as caught:
            sdk.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_completion_tokens=8
            )
        assert caught.value.param == "max_completion_tokens"
        completion = sdk.completions.create(model=MODEL, prompt=PROMPT, extra_body={"ignore_eos": True})
        assert completion.usage.completion_tokens == 7
        assert completion.choices[0].finish_reason == "length"
