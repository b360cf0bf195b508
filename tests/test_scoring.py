"""The scoring path on servers with the prefix cache on: prompt log-probabilities, the most
likely tokens at every position, and the requests lm-evaluation-harness's
`local-completions` sends, in its exact shapes (lm_eval/models/openai_completions.py and
api_models.py, version 0.4.13), for string and token-id requests.

Two servers: the hypercorn-launched one, with default settings (prefix cache on, the
CPU's own precision), and one with the prefix cache on and the settings under which
greedy decoding is exact (f32 compute and KV cache, no dynamic quantization: the
speculative-decoding tests use the same), where the scoring pass's most likely token can
be compared with the token greedy decoding picked. Figures are checked against direct
scoring: the served IR run with plain OpenVINO inference here, its logits turned into
log-probabilities with numpy.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import loopback
from conftest import HYPERCORN_MODEL, embedded_entry
from helpers import assert_error, post
from server_pool import server_fixture
from sse import stream_post
from vocab import embedded_vocabulary

MODEL = "SmolLM2-135M-Instruct"
EXACT_FLAGS = (
    "--enable-prefix-caching",
    "--inference-precision",
    "f32",
    "--kv-cache-precision",
    "f32",
    "--plugin-config",
    json.dumps({"DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}),
)
exact_scoring_server = server_fixture("exact_scoring_server", *EXACT_FLAGS)

DATA = Path(__file__).parent / "data" / "eval"
PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "In 1492, Columbus"]


def completions(base: str, model: str = MODEL, **body: Any) -> dict[str, Any]:
    reply = post(base, "/v1/completions", {"model": model, **body})
    assert reply.status_code == 200, reply.text
    return reply.json()


def tokenize(base: str, text: str, add_special_tokens: bool = True) -> list[int]:
    reply = post(base, "/tokenize", {"prompt": text, "add_special_tokens": add_special_tokens})
    assert reply.status_code == 200, reply.text
    return reply.json()["tokens"]


def detokenize(base: str, ids: list[int]) -> str:
    reply = post(base, "/detokenize", {"tokens": ids})
    assert reply.status_code == 200, reply.text
    return reply.json()["prompt"]


def check_top_lists(logprobs: dict[str, Any], k: int) -> None:
    """Every entry but an echoed prompt's first lists k tokens, most likely first, and
    none is less likely than the chosen token."""
    for position, (value, top) in enumerate(zip(logprobs["token_logprobs"], logprobs["top_logprobs"])):
        if value is None:
            assert position == 0 and top is None
            continue
        values = list(top.values())
        assert len(values) == k, top
        assert values == sorted(values, reverse=True), top
        assert values[0] >= value, (value, top)


# ---- the most likely tokens --------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 5, 20])
def test_top_logprobs_lead_with_the_token_greedy_decoding_picks(exact_scoring_server, k):
    """Generated positions: each chosen token is the first of its top list. Prompt
    positions: the first of each top list is the token greedy decoding writes after the
    prompt's tokens before it. Asked twice, so the second generation reads the prompt
    from the prefix cache."""
    base = exact_scoring_server.base_url
    for prompt in PROMPTS:
        for _ in range(2):
            body = completions(
                base, prompt=prompt, max_tokens=12, temperature=0, logprobs=k, echo=True, skip_special_tokens=False
            )
            logprobs = body["choices"][0]["logprobs"]
            check_top_lists(logprobs, k)
            prompt_tokens = body["usage"]["prompt_tokens"]
            generated = list(zip(logprobs["tokens"], logprobs["top_logprobs"]))[prompt_tokens:]
            assert len(generated) == body["usage"]["completion_tokens"] > 0
            for token, top in generated:
                assert next(iter(top)) == token, (prompt, token, top)
    ids = tokenize(base, PROMPTS[0])
    scored = completions(base, prompt=ids, max_tokens=0, echo=True, logprobs=k)["choices"][0]["logprobs"]
    for end in range(1, len(ids)):
        greedy = completions(base, prompt=ids[:end], max_tokens=1, temperature=0, skip_special_tokens=False)
        assert next(iter(scored["top_logprobs"][end])) == greedy["choices"][0]["text"], end


@pytest.mark.parametrize("stream", [False, True])
def test_chat_top_logprobs_lead_with_the_token_greedy_decoding_picks(exact_scoring_server, stream):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Name three colours."}],
        "max_tokens": 12,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 4,
        "skip_special_tokens": False,
    }
    if stream:
        entries, text = [], ""
        for chunk in stream_post(exact_scoring_server.base_url, "/v1/chat/completions", {**body, "stream": True}):
            for choice in chunk["choices"]:
                text += choice["delta"].get("content") or ""
                if choice["logprobs"]:
                    entries += choice["logprobs"]["content"]
    else:
        reply = post(exact_scoring_server.base_url, "/v1/chat/completions", body)
        assert reply.status_code == 200, reply.text
        choice = reply.json()["choices"][0]
        entries, text = choice["logprobs"]["content"], choice["message"]["content"]
    assert entries and "".join(entry["token"] for entry in entries) == text
    for entry in entries:
        top = entry["top_logprobs"]
        assert len(top) == 4
        assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
        assert top[0]["token"] == entry["token"] and top[0]["logprob"] == entry["logprob"]
        assert bytes(top[0]["bytes"]) == bytes(entry["bytes"])


def test_sampled_tokens_get_their_own_scores_beside_the_top_list(exact_scoring_server):
    """With sampling the chosen token need not be the most likely; its entry holds its own
    log-probability, and the top list the k most likely, sorted."""
    body = completions(
        exact_scoring_server.base_url, prompt=PROMPTS[1], max_tokens=16, temperature=1.5, seed=7, logprobs=3
    )
    logprobs = body["choices"][0]["logprobs"]
    check_top_lists(logprobs, 3)
    assert "".join(logprobs["tokens"]) == body["choices"][0]["text"]


def test_prompt_logprobs_rank_the_prompt_token_among_the_most_likely(hypercorn_server):
    base = hypercorn_server.base_url
    ids = tokenize(base, "The capital of France is banana")
    choice = completions(base, HYPERCORN_MODEL, prompt=ids, max_tokens=1, prompt_logprobs=3)["choices"][0]
    entries = choice["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(ids)
    for token_id, entry in zip(ids[1:], entries[1:]):
        own = entry[str(token_id)]
        alternatives = [value for key, value in entry.items() if value["rank"] <= 3]
        assert [value["rank"] for value in alternatives] == [1, 2, 3]
        assert [value["logprob"] for value in alternatives] == sorted(
            (value["logprob"] for value in alternatives), reverse=True
        )
        assert len(entry) == 3 + (own["rank"] > 3)
        # Its rank counts the tokens more likely than it.
        assert (own["rank"] == 1) == (own["logprob"] >= alternatives[0]["logprob"])
    # " banana" after "The capital of France is" is not the most likely token.
    assert entries[-1][str(ids[-1])]["rank"] > 1


@pytest.mark.parametrize(
    "body, param",
    [
        ({"logprobs": 21, "max_tokens": 1}, "logprobs"),
        ({"prompt_logprobs": 21, "max_tokens": 1}, "prompt_logprobs"),
    ],
)
def test_more_than_twenty_top_tokens_is_refused(exact_scoring_server, body, param):
    reply = post(exact_scoring_server.base_url, "/v1/completions", {"model": MODEL, "prompt": "Hi", **body})
    assert_error(reply, 400, param=param)


# ---- scoring with the prefix cache on ----------------------------------------------------


def direct_logprobs(ids: list[int]) -> np.ndarray:
    """log P(ids[i] | ids[:i]) for i >= 1, from the served IR run here with plain
    OpenVINO inference and numpy (float64) log-softmax over its logits."""
    xml = embedded_entry() / "openvino_model.xml"
    compiled = _compiled(str(xml))
    request = compiled.create_infer_request()
    request.reset_state()
    tokens = np.asarray([ids], dtype=np.int64)
    request.infer(
        {
            "input_ids": tokens,
            "attention_mask": np.ones_like(tokens),
            "position_ids": np.arange(len(ids), dtype=np.int64)[None],
            "beam_idx": np.zeros(1, dtype=np.int32),
        }
    )
    logits = request.get_tensor("logits").data[0].astype(np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    logprobs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return logprobs[np.arange(len(ids) - 1), ids[1:]]


_COMPILED: dict[str, Any] = {}


def _compiled(xml: str) -> Any:
    if xml not in _COMPILED:
        import openvino as ov

        _COMPILED[xml] = ov.Core().compile_model(xml, "CPU")
    return _COMPILED[xml]


# Scoring and direct scoring run the same IR with the same precision on the same CPU;
# they differ in the log-softmax (in the graph, float32, against numpy's float64).
DIRECT_TOLERANCE = 1e-3


def test_scoring_works_with_the_prefix_cache_and_matches_direct_scoring(hypercorn_server):
    base = hypercorn_server.base_url
    prompt = "The quick brown fox jumps over the lazy dog because it wants to see the other side"
    ids = tokenize(base, prompt)
    expected = direct_logprobs(ids)
    # A generation first puts the prompt's blocks in the engine's prefix cache.
    completions(base, HYPERCORN_MODEL, prompt=ids, max_tokens=4, temperature=0)
    for body in (
        {"echo": True, "logprobs": 1, "max_tokens": 1},
        {"echo": True, "logprobs": 0, "max_tokens": 0},
        {"prompt_logprobs": 0, "max_tokens": 2},
    ):
        choice = completions(base, HYPERCORN_MODEL, prompt=ids, **body)["choices"][0]
        if "prompt_logprobs" in body:
            values = [
                entry[str(token_id)]["logprob"] for token_id, entry in zip(ids[1:], choice["prompt_logprobs"][1:])
            ]
        else:
            values = choice["logprobs"]["token_logprobs"][1 : len(ids)]
            assert "".join(choice["logprobs"]["tokens"][: len(ids)]) == prompt
        assert np.allclose(values, expected, atol=DIRECT_TOLERANCE), body


def test_a_scored_stream_carries_the_same_figures(hypercorn_server):
    base = hypercorn_server.base_url
    body = {
        "model": HYPERCORN_MODEL,
        "prompt": PROMPTS[0],
        "max_tokens": 4,
        "temperature": 0,
        "logprobs": 2,
        "echo": True,
    }
    unary = completions(base, **body)["choices"][0]
    tokens, values, tops, text = [], [], [], ""
    for chunk in stream_post(base, "/v1/completions", {**body, "stream": True}):
        for choice in chunk["choices"]:
            text += choice["text"]
            if choice["logprobs"]:
                tokens += choice["logprobs"]["tokens"]
                values += choice["logprobs"]["token_logprobs"]
                tops += choice["logprobs"]["top_logprobs"]
    assert text == unary["text"]
    assert tokens == unary["logprobs"]["tokens"]
    assert values == unary["logprobs"]["token_logprobs"] and tops == unary["logprobs"]["top_logprobs"]


# ---- lm-evaluation-harness's requests -----------------------------------------------------


def lm_eval_loglikelihood(
    base: str, requests: list[tuple[list[int], list[int]]], tokenized: bool
) -> list[tuple[float, bool]]:
    """LocalCompletionsAPI's loglikelihood: one request for the batch (context +
    continuation ids; with tokenized_requests=False the texts /detokenize gives, a string
    for a batch of one), then its parse_logprobs."""
    prompts: Any = [context + continuation for context, continuation in requests]
    if not tokenized:
        prompts = [detokenize(base, ids) for ids in prompts]
        if len(prompts) == 1:
            prompts = prompts[0]
    payload = {
        "model": HYPERCORN_MODEL,
        "prompt": prompts,
        "temperature": 0,
        "max_tokens": 1,
        "logprobs": 1,
        "seed": 1234,
        "echo": True,
    }
    reply = post(base, "/v1/completions", payload)
    assert reply.status_code == 200, reply.text
    results = []
    ctxlens = [len(context) for context, _ in requests]
    for choice, ctxlen in zip(sorted(reply.json()["choices"], key=lambda c: c["index"]), ctxlens):
        values = choice["logprobs"]["token_logprobs"][ctxlen:-1]
        tops = choice["logprobs"]["top_logprobs"][ctxlen:-1]
        is_greedy = all(value == max(top.values()) for value, top in zip(values, tops))
        results.append((sum(values), is_greedy))
    return results


def rolling_windows(tokens: list[int], prefix_token: int, max_seq_len: int) -> list[tuple[list[int], list[int]]]:
    """lm_eval.utils.get_rolling_token_windows (context_len 1) + make_disjoint_window."""
    windows = []
    first = min(max_seq_len, len(tokens))
    windows.append(([prefix_token] + tokens[: first - 1], tokens[:first]))
    predicted = first
    while predicted < len(tokens):
        length = min(len(tokens) - predicted, max_seq_len)
        end = predicted + length
        windows.append((tokens[end - max_seq_len - 1 : end - 1], tokens[end - length : end]))
        predicted += length
    return [(context[: len(context) - (len(continuation) - 1)], continuation) for context, continuation in windows]


def prefix_token(base: str) -> int:
    """The remote tokenizer's prefix token: BOS, else EOS."""
    info = loopback.get(base + "/tokenizer_info", timeout=30).json()
    return info["bos_token_id"] or info["eos_token_id"]


def lm_eval_rolling(base: str, text: str, tokenized: bool, max_length: int) -> float:
    """loglikelihood_rolling: the text's tokens (remote tokenizer: /tokenize without
    special tokens) in windows after the prefix token, each scored as one loglikelihood
    request (lm-eval's max_length - 1 is its window, less one for the context)."""
    prefix = prefix_token(base)
    tokens = tokenize(base, text, add_special_tokens=False)
    windows = rolling_windows(tokens, prefix, max_length - 1 - 1)
    return sum(lm_eval_loglikelihood(base, [window], tokenized)[0][0] for window in windows)


def test_lm_eval_loglikelihood_multiple_choice_by_ids_and_by_text(hypercorn_server):
    base = hypercorn_server.base_url
    docs = [json.loads(line) for line in (DATA / "capitals.jsonl").read_text().splitlines()]
    requests = [
        (tokenize(base, doc["context"], add_special_tokens=False), tokenize(base, choice, add_special_tokens=False))
        for doc in docs
        for choice in doc["choices"]
    ]
    # lm-eval sends batch_size requests at once (the server here runs at most 8 choices).
    by_ids = [
        result
        for at in range(0, len(requests), 4)
        for result in lm_eval_loglikelihood(base, requests[at : at + 4], tokenized=True)
    ]
    by_text = [lm_eval_loglikelihood(base, [request], tokenized=False)[0] for request in requests]
    for (context, continuation), (score, greedy), (text_score, text_greedy) in zip(requests, by_ids, by_text):
        direct = direct_logprobs(context + continuation)[len(context) - 1 :]
        assert math.isclose(score, float(direct.sum()), abs_tol=DIRECT_TOLERANCE * len(continuation))
        assert math.isclose(text_score, score, abs_tol=DIRECT_TOLERANCE * len(continuation))
        assert greedy == text_greedy
    # is_greedy is not always true: some continuations are not the model's first choice.
    assert not all(greedy for _, greedy in by_ids)
    accuracy = [
        max(range(len(doc["choices"])), key=lambda i: by_ids[at + i][0]) == doc["gold"]
        for doc, at in zip(docs, range(0, len(by_ids), 3))
    ]
    assert sum(accuracy) >= 1  # the model knows some capitals; the point is the figures above


@pytest.mark.parametrize("max_length", [2048, 24])
def test_lm_eval_loglikelihood_rolling_keeps_special_tokens_through_detokenize(hypercorn_server, max_length):
    """The texts go through /detokenize with tokenized_requests=False: a special token
    (the prefix token, the chat markers) that came back as nothing would change the score."""
    base = hypercorn_server.base_url
    for line in (DATA / "rolling.jsonl").read_text().splitlines():
        text = json.loads(line)["text"]
        by_ids = lm_eval_rolling(base, text, tokenized=True, max_length=max_length)
        by_text = lm_eval_rolling(base, text, tokenized=False, max_length=max_length)
        assert math.isclose(by_ids, by_text, abs_tol=1e-3), (by_ids, by_text)
        if max_length == 2048:  # one window: the prefix token, then the whole text
            ids = [prefix_token(base)] + tokenize(base, text, add_special_tokens=False)
            assert math.isclose(by_ids, float(direct_logprobs(ids).sum()), abs_tol=DIRECT_TOLERANCE * len(ids))


def test_lm_eval_generate_until_with_six_stop_strings(hypercorn_server):
    """humaneval's five `until` strings plus the end-of-sequence string lm-eval adds."""
    base = hypercorn_server.base_url
    stop = ["\nclass", "\ndef", "\n#", "\nif", "\nprint", embedded_vocabulary().eos_text()]
    texts = {}
    for form in ("ids", "text"):
        prompt = tokenize(base, "def add(a, b):\n", add_special_tokens=False) if form == "ids" else "def add(a, b):\n"
        payload = {
            "model": HYPERCORN_MODEL,
            "prompt": [prompt],
            "max_tokens": 48,
            "temperature": 0,
            "stop": stop,
            "seed": 1234,
        }
        reply = post(base, "/v1/completions", payload)
        assert reply.status_code == 200, reply.text
        texts[form] = reply.json()["choices"][0]["text"]
        assert not any(s in texts[form] for s in stop)
    assert texts["ids"] == texts["text"]


# ---- tokens and text ------------------------------------------------------------------------


CHAT_TEXT = "<|im_start|>user\nHi there<|im_end|>\n"


def test_detokenize_keeps_special_tokens(hypercorn_server):
    base = hypercorn_server.base_url
    ids = tokenize(base, CHAT_TEXT, add_special_tokens=False)
    assert set(ids) & embedded_vocabulary().table.special_ids
    assert detokenize(base, ids) == CHAT_TEXT


@pytest.mark.parametrize("form", ["text", "ids"])
def test_echoed_entries_join_to_the_echoed_text_special_tokens_included(hypercorn_server, form):
    base = hypercorn_server.base_url
    ids = tokenize(base, CHAT_TEXT)
    prompt: Any = CHAT_TEXT if form == "text" else ids
    choice = completions(base, HYPERCORN_MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=1)["choices"][0]
    tokens = choice["logprobs"]["tokens"]
    assert choice["text"] == CHAT_TEXT
    assert "".join(tokens) == CHAT_TEXT
    assert tokens[0] == "<|im_start|>" and "<|im_end|>" in tokens
    assert choice["logprobs"]["text_offset"] == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]


def test_return_token_strs_are_the_vocabulary_pieces(hypercorn_server):
    reply = post(hypercorn_server.base_url, "/tokenize", {"prompt": "😀 café", "return_token_strs": True}).json()
    pieces = embedded_vocabulary().table.pieces
    assert reply["token_strs"] == [pieces[i] for i in reply["tokens"]]
    assert all("\ufffd" not in piece for piece in reply["token_strs"])


# ---- stop strings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {"prompt": "Count: 1, 2, 3,", "max_tokens": 8}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Count to ten"}], "max_tokens": 8}),
        ("/v1/responses", {"input": "Count to ten", "max_output_tokens": 8}),
    ],
)
def test_many_stop_strings_are_taken_up_to_the_cap(hypercorn_server, path, body):
    base = hypercorn_server.base_url
    many = [f"never-{i}" for i in range(64)]
    reply = post(base, path, {"model": HYPERCORN_MODEL, **body, "stop": many})
    assert reply.status_code == 200, reply.text
    too_many = post(base, path, {"model": HYPERCORN_MODEL, **body, "stop": many + ["one more"]})
    assert "64" in assert_error(too_many, 400, param="stop")["message"]


def test_responses_top_logprobs_is_refused_not_ignored(hypercorn_server):
    reply = post(
        hypercorn_server.base_url,
        "/v1/responses",
        {"model": HYPERCORN_MODEL, "input": "Hi", "max_output_tokens": 2, "top_logprobs": 2},
    )
    assert_error(reply, 400, param="top_logprobs")


def test_the_server_answers_while_a_long_prompt_is_scored(hypercorn_server):
    """Scoring runs in a worker thread, a chunk at a time, without the GIL: /health
    answers within a fraction of the scoring's time while it runs (both measured in
    the same run, so a busy machine slows the two alike; a scoring that held the GIL
    keeps one /health waiting for most of it)."""
    import threading
    import time

    base = hypercorn_server.base_url
    # 1,150 tokens: five of the scorer's 256-token chunks, each slower than the one before
    # (its context grows); 2,020 took three times as long and proved nothing more.
    text = " ".join(f"word{i % 97}" for i in range(400))
    done = threading.Event()
    outcome: dict[str, Any] = {}

    def score() -> None:
        started = time.monotonic()
        try:  # a request that fails must still end the probing loop below
            outcome["reply"] = post(
                base,
                "/v1/completions",
                {"model": HYPERCORN_MODEL, "prompt": text, "max_tokens": 0, "echo": True, "logprobs": 1},
            )
        finally:
            outcome["seconds"] = time.monotonic() - started
            done.set()

    worker = threading.Thread(target=score)
    worker.start()
    waits = []
    while not done.is_set():
        started = time.monotonic()
        assert loopback.get(base + "/health", timeout=30).status_code == 200
        waits.append(time.monotonic() - started)
        time.sleep(0.05)
    worker.join()
    assert "reply" in outcome, "the scoring request raised (its traceback is above)"
    assert outcome["reply"].status_code == 200, outcome["reply"].text
    assert outcome["reply"].json()["usage"]["prompt_tokens"] > 1000
    assert len(waits) >= 3
    waits.sort()
    assert waits[len(waits) // 2] < outcome["seconds"] / 10, (waits, outcome["seconds"])
    assert waits[-1] < outcome["seconds"] / 2, (waits, outcome["seconds"])
