"""Speculative decoding: prompt lookup (`--prompt-lookup`) and a draft model
(`--draft-model`, here the embedded model as its own draft), as OVMS serves them.

The main model verifies every candidate, so greedy output is its own up to the
arithmetic. These servers run with the settings that make it exact (f32 compute, an f32
KV cache, the CPU's dynamic quantization of activations off: a verification pass of k
positions and a decoding pass of one then compute each position alike), and a plain
server with the same settings gives the output to match, token for token.
Speculative steps bring several tokens at once: streams must still equal unary output,
cut stop strings and max_tokens exactly, and report every token's log-probability.
"""

from __future__ import annotations

from typing import Any

import pytest

from conftest import RunningServer
from helpers import assert_error, chat, chat_stream, complete, complete_stream, pick_stop_word, post
from ovtrio.model import embedded_model_path
from server_pool import server_fixture
from sse import MODEL
from test_responses import stream_events

EXACT_ARITHMETIC = (
    "--inference-precision",
    "f32",
    "--kv-cache-precision",
    "f32",
    "--plugin-config",
    '{"DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}',
)
prompt_lookup_server = server_fixture("prompt_lookup_server", "--prompt-lookup", *EXACT_ARITHMETIC)
draft_server = server_fixture("draft_server", "--draft-model", str(embedded_model_path()), *EXACT_ARITHMETIC)
plain_exact_server = server_fixture("plain_exact_server", *EXACT_ARITHMETIC)

# A text to repeat: prompt lookup finds its n-grams in the prompt.
PASSAGE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n    return a * b\n\n"
REWRITE = [{"role": "user", "content": f"Copy this code exactly:\n\n{PASSAGE}"}]
# Enough for several speculative steps (the code copy left plain decoding's text by token
# 10 without the exact settings), few enough to keep the draft model's cost down.
TOKENS = 24


def _tokens(server: RunningServer, text: str) -> list[int]:
    reply = post(server.base_url, "/tokenize", {"prompt": text})
    assert reply.status_code == 200, reply.text
    return reply.json()["tokens"]


def test_fields_name_the_setting_that_enables_them(server: RunningServer) -> None:
    for field, value, setting in (
        ("num_assistant_tokens", 3, "--draft-model"),
        ("assistant_confidence_threshold", 0.4, "--draft-model"),
        ("max_ngram_size", 3, "--prompt-lookup"),
    ):
        body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, field: value}
        error = assert_error(post(server.base_url, "/v1/completions", body), 400, param=field)
        assert setting in error["message"]


def test_field_rules_per_way_of_speculating(prompt_lookup_server: RunningServer, draft_server: RunningServer) -> None:
    def refused(server: RunningServer, param: str, **fields: Any) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, **fields}
        assert_error(post(server.base_url, "/v1/chat/completions", body), 400, param=param)

    for server in (prompt_lookup_server, draft_server):
        refused(server, "assistant_confidence_threshold", num_assistant_tokens=3, assistant_confidence_threshold=0.4)
        refused(server, "num_assistant_tokens", num_assistant_tokens=0)
        refused(server, "best_of", best_of=2, temperature=0)  # beam search cannot speculate
    refused(prompt_lookup_server, "assistant_confidence_threshold", assistant_confidence_threshold=0.4)
    refused(prompt_lookup_server, "max_ngram_size", max_ngram_size=0)
    refused(draft_server, "max_ngram_size", max_ngram_size=3)
    refused(draft_server, "assistant_confidence_threshold", assistant_confidence_threshold=1.5)


@pytest.mark.parametrize(
    "text", [PASSAGE + PASSAGE[:40], "Write a short story about a lighthouse keeper."], ids=["code-to-copy", "prose"]
)
def test_speculative_greedy_output_is_plain_greedy_output(
    text: str,
    prompt_lookup_server: RunningServer,
    draft_server: RunningServer,
    plain_exact_server: RunningServer,
) -> None:
    """Each way of speculating, with its defaults and with other settings, writes exactly
    what plain decoding writes: the same tokens, with the same log-probabilities."""
    prompt_ids = _tokens(plain_exact_server, text)
    # logprobs 0: the engine's own figures (1 and more would come from the scoring pass).
    params = {"prompt": prompt_ids, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True, "logprobs": 0}
    plain = complete(plain_exact_server.base_url, **params)
    assert plain.usage["completion_tokens"] == TOKENS
    for server, fields in (
        (prompt_lookup_server, {}),  # the server's defaults: 5 tokens, 3-grams
        (prompt_lookup_server, {"num_assistant_tokens": 3, "max_ngram_size": 2}),
        (draft_server, {}),  # num_assistant_tokens 5
        (draft_server, {"assistant_confidence_threshold": 0.4}),
    ):
        reply = complete(server.base_url, **params, **fields)
        assert reply.text == plain.text, fields
        assert reply.usage == plain.usage, fields
        tokens, logprobs = _logprobs(reply)
        assert tokens == _logprobs(plain)[0], fields
        # The values agree to rounding (measured: 1e-5 apart), not bit for bit.
        assert logprobs == pytest.approx(_logprobs(plain)[1], abs=1e-3), fields


def _logprobs(reply: Any) -> tuple[list[str], list[float]]:
    logprobs = reply.body["choices"][0]["logprobs"]
    return logprobs["tokens"], logprobs["token_logprobs"]


@pytest.fixture(params=["prompt_lookup_server", "draft_server"])
def speculating_server(request: pytest.FixtureRequest, prompt_lookup_server, draft_server) -> RunningServer:
    """Each way of speculating in turn (both named, so both start with the session's servers)."""
    return {"prompt_lookup_server": prompt_lookup_server, "draft_server": draft_server}[request.param]


def test_streams_equal_unary_output(speculating_server: RunningServer) -> None:
    server = speculating_server
    params = {"messages": REWRITE, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True, "logprobs": True}
    unary = chat(server.base_url, **params)
    assert unary.usage["completion_tokens"] == TOKENS
    streamed = chat_stream(server.base_url, stream_options={"include_usage": True}, **params)
    assert streamed.texts == [unary.text]
    assert streamed.usage == unary.usage
    assert streamed.finish_reasons == [unary.finish_reason] == ["length"]
    unary_logprobs = unary.body["choices"][0]["logprobs"]["content"]
    streamed_logprobs = [entry for chunk in streamed.choices[0].logprobs for entry in chunk["content"]]
    assert len(unary_logprobs) == TOKENS
    assert [(e["token"], e["logprob"]) for e in streamed_logprobs] == [
        (e["token"], e["logprob"]) for e in unary_logprobs
    ]

    # A stop string from that output cuts both exactly where it first occurs.
    completion = {"prompt": "Copy:\n" + PASSAGE, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True}
    cut = complete(server.base_url, **completion)
    stop, at = pick_stop_word(cut.text)
    stopped = complete(server.base_url, stop=stop, **completion)
    stopped_stream = complete_stream(server.base_url, stop=stop, **completion)
    assert stopped.text == cut.text[:at]
    assert stopped.finish_reason == "stop"
    assert stopped_stream.texts == [cut.text[: at + len(stop)]]  # streamed output keeps the stop string
    assert stopped_stream.finish_reasons == ["stop"]


def test_responses_api_speculates(prompt_lookup_server: RunningServer) -> None:
    body = {
        "model": MODEL,
        "input": REWRITE[0]["content"],
        "max_output_tokens": 24,
        "temperature": 0,
        "num_assistant_tokens": 4,
        "max_ngram_size": 2,
        "store": False,
    }
    unary = post(prompt_lookup_server.base_url, "/v1/responses", body)
    assert unary.status_code == 200, unary.text
    text = unary.json()["output"][0]["content"][0]["text"]
    streamed = {key: value for key, value in body.items() if key != "model"}
    events = stream_events(prompt_lookup_server, **streamed)
    deltas = "".join(event["delta"] for event in events if event.get("type") == "response.output_text.delta")
    assert deltas == text
    assert_error(
        post(prompt_lookup_server.base_url, "/v1/responses", {**body, "assistant_confidence_threshold": 0.5}),
        400,
        param="assistant_confidence_threshold",
    )


def test_metrics_count_drafted_and_accepted_tokens(speculating_server: RunningServer) -> None:
    server = speculating_server
    names = (
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
    )
    before = [server.metric(name, model_name=MODEL, engine="0") for name in names]
    complete(server.base_url, prompt=PASSAGE * 2, max_tokens=TOKENS, temperature=0, ignore_eos=True)
    drafts, drafted, accepted = (
        server.metric(name, model_name=MODEL, engine="0") - b for name, b in zip(names, before)
    )
    assert drafts >= 1
    assert 0 < accepted <= drafted
    # Each verification step adds its accepted tokens and one of the main model's own.
    assert accepted + drafts <= TOKENS
