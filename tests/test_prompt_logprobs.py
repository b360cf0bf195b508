"""Scoring prompts on /v1/completions: `echo` with `logprobs`, vLLM's `prompt_logprobs`,
and `max_tokens: 0`, as evaluation clients (lm-evaluation-harness) use them.

The scores are checked independently of how the server computes them: the model
continues a prompt greedily with logprobs, then prompt + continuation is scored with
echo, and the continuation's prompt logprobs must match the logprobs reported while it
was generated. They are computed differently (one prefill over the whole text against
one decode step per token), which on this machine's CPU plugin moves a token's
log-probability by up to 0.24 (measured over eight prompts of eight tokens; most
differ by under 0.1): the tolerance is 0.35 per token and 0.15 on average. A scoring
that is off by one position, or scores the wrong tokens, is off by whole units.
"""

from __future__ import annotations

from typing import Any

import pytest

import loopback
from conftest import HYPERCORN_MODEL
from helpers import assert_error, post
from openai_schema import validate, validate_completion_chunk
from sse import MODEL, stream_post
from vocab import embedded_vocabulary

PER_TOKEN_TOLERANCE = 0.35
MEAN_TOLERANCE = 0.15

CONTEXTS = [
    "The capital of France is",
    "Water boils at a temperature of",
    "In the morning I usually drink",
]
DISTRACTORS = [" purple elephants dancing slowly", " 42 42 42 42", " nevertheless umbrella the of"]


def tokenize(server, text: str, add_special_tokens: bool = True) -> list[int]:
    reply = post(server.base_url, "/tokenize", {"prompt": text, "add_special_tokens": add_special_tokens})
    assert reply.status_code == 200, reply.text
    return reply.json()["tokens"]


def completions(server, **body: Any) -> dict[str, Any]:
    reply = post(server.base_url, "/v1/completions", {"model": MODEL, **body})
    assert reply.status_code == 200, reply.text
    return reply.json()


def greedy_continuation(server, context_ids: list[int], tokens: int = 8) -> list[tuple[int, float]]:
    """The model's own greedy continuation of `context_ids`: (token id, logprob reported
    when it was generated), up to the first token that added no text (an end token)."""
    # logprobs 0: the engine's own figure for each chosen token (no scoring pass).
    choice = completions(server, prompt=context_ids, max_tokens=tokens, logprobs=0, temperature=0)["choices"][0]
    vocabulary = embedded_vocabulary()
    continuation = []
    for token, logprob in zip(choice["logprobs"]["tokens"], choice["logprobs"]["token_logprobs"]):
        if not token:
            break
        continuation.append((vocabulary.token_id(token), logprob))
    assert continuation, choice
    return continuation


def loglikelihood_requests(server, requests: list[tuple[list[int], list[int]]]) -> list[float]:
    """lm-evaluation-harness's `local-completions` loglikelihood: one batched request of
    context + continuation ids, then the sum of the continuation's echoed logprobs."""
    body = {
        "model": MODEL,
        "prompt": [context + continuation for context, continuation in requests],
        "max_tokens": 1,
        "logprobs": 1,
        "echo": True,
        "temperature": 0,
    }
    reply = completions(server, **body)
    scores = []
    for choice, (context, continuation) in zip(reply["choices"], requests):
        values = choice["logprobs"]["token_logprobs"][len(context) : len(context) + len(continuation)]
        assert None not in values
        scores.append(sum(values))
    return scores


def test_scores_of_a_continuation_match_its_generation_and_the_model_prefers_it(server):
    for context in CONTEXTS:
        context_ids = tokenize(server, context)
        generated = greedy_continuation(server, context_ids)
        own = [token_id for token_id, _ in generated]
        # Scored alone, as generation ran alone (same shape).
        scored = completions(server, prompt=[context_ids + own], max_tokens=0, logprobs=1, echo=True)
        values = scored["choices"][0]["logprobs"]["token_logprobs"][len(context_ids) :]
        differences = [abs(value - logprob) for value, (_, logprob) in zip(values, generated, strict=True)]
        assert max(differences) <= PER_TOKEN_TOLERANCE, differences
        assert sum(differences) / len(differences) <= MEAN_TOLERANCE, differences
        # The multiple-choice question lm-eval would ask: the model's own continuation wins.
        choices = [own] + [tokenize(server, text, add_special_tokens=False) for text in DISTRACTORS]
        scores = loglikelihood_requests(server, [(context_ids, choice) for choice in choices])
        assert max(range(len(scores)), key=scores.__getitem__) == 0, scores


def _check_echoed_choice(choice: dict[str, Any], prompt_tokens: int) -> None:
    """Echo with logprobs: the entries cover the prompt then the completion, join to the
    choice's text, and the first (the prompt's first token) has no logprob."""
    logprobs = choice["logprobs"]
    tokens = logprobs["tokens"]
    assert "".join(tokens) == choice["text"]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert all(isinstance(value, float) and value <= 0 for value in logprobs["token_logprobs"][1:])
    assert len(tokens) >= prompt_tokens
    offsets = [sum(len(token) for token in tokens[:i]) for i in range(len(tokens))]
    assert logprobs["text_offset"] == offsets
    # logprobs 1: the most likely token at each position, no less likely than the chosen one.
    for value, top in zip(logprobs["token_logprobs"][1:], logprobs["top_logprobs"][1:]):
        assert len(top) == 1 and next(iter(top.values())) >= value


def _streamed(server, body: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Each choice of a stream, its chunks' text and logprobs joined."""
    merged: dict[int, dict[str, Any]] = {}
    for chunk in stream_post(server.base_url, "/v1/completions", {**body, "stream": True}):
        validate_completion_chunk(chunk)
        for choice in chunk["choices"]:
            state = merged.setdefault(choice["index"], {"text": "", "logprobs": None, "prompt_logprobs": None})
            state["text"] += choice["text"]
            if choice.get("prompt_logprobs") is not None:
                state["prompt_logprobs"] = choice["prompt_logprobs"]
            if choice["logprobs"] is not None:
                if state["logprobs"] is None:
                    state["logprobs"] = {key: list(value) for key, value in choice["logprobs"].items()}
                else:
                    for key, value in choice["logprobs"].items():
                        state["logprobs"][key] += value
            if choice["finish_reason"] is not None:
                state["finish_reason"] = choice["finish_reason"]
    return merged


PROMPTS = {
    "string": "The capital of France is",
    "strings": ["The capital of France is", "Hello, my name is"],
}


@pytest.mark.parametrize("form", ["string", "strings", "ids", "id lists"])
@pytest.mark.parametrize("n", [1, 2])
def test_echo_with_logprobs_covers_prompt_then_completion_unary_and_streamed(server, form, n):
    texts = PROMPTS["strings"] if form in ("strings", "id lists") else [PROMPTS["string"]]
    ids = [tokenize(server, text) for text in texts]
    prompt: Any = {"string": texts[0], "strings": texts, "ids": ids[0], "id lists": ids}[form]
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "logprobs": 1, "echo": True, "temperature": 0, "n": n}
    unary = completions(server, **{k: v for k, v in body.items() if k != "model"})
    validate(unary, "CreateCompletionResponse")
    assert len(unary["choices"]) == len(texts) * n
    for choice in unary["choices"]:
        text = texts[choice["index"] // n]
        assert choice["text"].startswith(text)
        _check_echoed_choice(choice, len(ids[choice["index"] // n]))
        assert "".join(choice["logprobs"]["tokens"][: len(ids[choice["index"] // n])]) == text
    assert unary["usage"]["prompt_tokens"] == sum(len(i) for i in ids)
    streamed = _streamed(server, body)
    assert sorted(streamed) == list(range(len(unary["choices"])))
    for choice in unary["choices"]:
        twin = streamed[choice["index"]]
        assert twin["text"] == choice["text"]
        assert twin["logprobs"]["tokens"] == choice["logprobs"]["tokens"]
        assert twin["logprobs"]["text_offset"] == choice["logprobs"]["text_offset"]
        assert twin["logprobs"]["token_logprobs"] == pytest.approx(choice["logprobs"]["token_logprobs"])


@pytest.mark.parametrize("stream", [False, True])
def test_max_tokens_zero_with_echo_scores_the_prompt_and_generates_nothing(server, stream):
    prompt = "The quick brown fox jumps over the lazy dog"
    prompt_ids = tokenize(server, prompt)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 0, "logprobs": 1, "echo": True}
    if stream:
        body["stream_options"] = {"include_usage": True}
        chunks = stream_post(server.base_url, "/v1/completions", {**body, "stream": True})
        choice = _streamed(server, body)[0]
        usage = chunks[-1]["usage"]
    else:
        reply = completions(server, **{k: v for k, v in body.items() if k != "model"})
        choice, usage = reply["choices"][0], reply["usage"]
    assert choice["text"] == prompt
    assert choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["tokens"]) == len(prompt_ids)
    _check_echoed_choice(choice, len(prompt_ids))
    assert usage == {"prompt_tokens": len(prompt_ids), "completion_tokens": 0, "total_tokens": len(prompt_ids)}


def test_max_tokens_zero_without_logprobs_echoes_the_prompt(server):
    reply = completions(server, prompt="Hello there", max_tokens=0, echo=True)
    assert reply["choices"][0]["text"] == "Hello there" and reply["choices"][0]["logprobs"] is None
    assert reply["usage"]["completion_tokens"] == 0


def test_prompt_logprobs_in_vllm_shape_agree_with_echoed_logprobs(server):
    prompt_ids = tokenize(server, "The capital of France is")
    body = {"prompt": prompt_ids, "max_tokens": 2, "logprobs": 1, "echo": True, "prompt_logprobs": 0, "temperature": 0}
    choice = completions(server, **body)["choices"][0]
    entries = choice["prompt_logprobs"]
    assert len(entries) == len(prompt_ids) and entries[0] is None
    echoed = choice["logprobs"]["token_logprobs"][: len(prompt_ids)]
    for token_id, entry, value, token in zip(prompt_ids[1:], entries[1:], echoed[1:], choice["logprobs"]["tokens"][1:]):
        assert list(entry) == [str(token_id)]  # prompt_logprobs 0: the token itself only
        own = entry[str(token_id)]
        assert (own["logprob"], own["decoded_token"]) == (value, token)
        assert isinstance(own["rank"], int) and own["rank"] >= 1
    # Without echo: the text is the completion alone; the prompt's scores are the same.
    alone = completions(server, **{**body, "echo": False})["choices"][0]
    assert alone["prompt_logprobs"] == entries
    assert len(alone["logprobs"]["tokens"]) == 2
    streamed = _streamed(server, {"model": MODEL, **body, "echo": False})[0]
    assert streamed["prompt_logprobs"] == entries and streamed["text"] == alone["text"]


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/v1/completions", {"prompt": "Hi", "max_tokens": 0}, "max_tokens"),
        ("/v1/completions", {"prompt": "Hi", "max_tokens": 0, "logprobs": 1}, "max_tokens"),
        ("/v1/completions", {"prompt": "Hi", "max_tokens": -1, "echo": True}, "max_tokens"),
        ("/v1/completions", {"prompt": "Hi", "prompt_logprobs": 21}, "prompt_logprobs"),
        ("/v1/completions", {"prompt": "Hi", "prompt_logprobs": -1}, "prompt_logprobs"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hi"}], "prompt_logprobs": 1},
            "prompt_logprobs",
        ),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 0}, "max_tokens"),
    ],
)
def test_bad_scoring_requests_name_the_field(server, path, body, param):
    assert_error(post(server.base_url, path, {"model": MODEL, **body}), 400, param=param)


def test_tokenizer_info_serves_a_remote_tokenizer(server):
    """What lm-eval's remote tokenizer reads: the special tokens (it encodes eos_token
    through /tokenize to find its id) and the chat template."""
    for path in ("/tokenizer_info", "/v1/tokenizer_info", "/v3/tokenizer_info"):
        info = loopback.get(server.base_url + path, timeout=30).json()
        assert {"eos_token", "bos_token", "pad_token", "chat_template", "model_max_length"} <= set(info)
    assert info["model_max_length"] == 8192
    vocabulary = embedded_vocabulary()
    assert tokenize(server, info["eos_token"], add_special_tokens=False) == [info["eos_token_id"]]
    assert info["eos_token_id"] in vocabulary.table.special_ids
    assert "{%" in info["chat_template"]


def test_prompt_scoring_is_served_while_prefix_caching_is_on(hypercorn_server):
    """The scoring path does not read the engine's prefix cache: every scoring request is
    served on a server with the cache on (the hypercorn-launched one: the default)."""
    base = hypercorn_server.base_url
    for body in [
        {"echo": True, "logprobs": 1, "max_tokens": 1},
        {"prompt_logprobs": 0, "max_tokens": 1},
        {"echo": True, "max_tokens": 0, "logprobs": 0},
    ]:
        for _ in range(2):  # the second time the engine has the prompt's blocks cached
            reply = post(base, "/v1/completions", {"model": HYPERCORN_MODEL, "prompt": "Hi there, how are you", **body})
            assert reply.status_code == 200, reply.text
            choice = reply.json()["choices"][0]
            scores = choice["logprobs"]["token_logprobs"] if body.get("echo") else choice["prompt_logprobs"]
            assert scores[0] is None and len(scores) >= 5 and all(s is not None for s in scores[1:])
