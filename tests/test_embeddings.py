"""/v1/embeddings and /v1/rerank on a real server: the embedded all-MiniLM-L6-v2, and a
random-weight cross-encoder written by encoder_fixtures.py.

What the server returns is compared with a numpy forward pass of the same weights
(numpy_bert.py), tokenized by the `tokenizers` library from the shipped tokenizer.json:
nothing here is taken from the server itself. The encoder server computes in f32, where
the two agree to a cosine of 1.0000 (bf16 gives about 0.99997)."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import numpy as np
import pytest

from conftest import MODEL, RunningServer
from encoder_fixtures import embedded_files, reranker_weights, write_reranker
from helpers import assert_error, beside_innocent_streams, post
from numpy_bert import cross_encoder_score, mean_pooled
from server_pool import server_fixture

EMBEDDER = "all-MiniLM-L6-v2"
RERANKER = "reranker"
LIMIT = 256  # the embedded model's max_seq_length
MAX_INPUTS = 600
QUEUED = 2
HOLDER_INPUTS = 160  # about 16,000 tokens: some seconds of work
REQUEST_TOKENS = 20_000  # the most one request may have computed: above the holder's

encoder_server = server_fixture(
    "encoder_server",
    "--encoder-inference-precision",
    "f32",
    "--encoder-max-batch",
    "8",
    "--encoder-max-queued-requests",
    str(QUEUED),
    "--max-inputs-per-request",
    str(MAX_INPUTS),
    "--encoder-max-request-tokens",
    str(REQUEST_TOKENS),
    "--rerank-model",
    "{folder}/" + RERANKER,
    prepare=lambda folder: write_reranker(folder / RERANKER),
)


def ids_of(text: str, special: bool = True) -> list[int]:
    _, _, tokenizer = embedded_files()
    return tokenizer.encode(text, add_special_tokens=special).ids


def reference(text: str) -> np.ndarray:
    weights, config, _ = embedded_files()
    return mean_pooled(weights, config, ids_of(text))


def cosine(a: Any, b: Any) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def embed(server: RunningServer, **body: Any) -> httpx.Response:
    return httpx.post(server.v1 + "/embeddings", json={"model": EMBEDDER, **body}, timeout=600)


def wait_for(condition: Callable[[], bool], what: str, within: float = 120) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {within} s"
        time.sleep(0.05)


TEXTS = ["A man is eating food.", "The stock market fell today.", "Zoë's naïve café serves crème brûlée!"]


def test_sdk_floats_and_base64_equal_a_numpy_forward_pass(encoder_server: RunningServer) -> None:
    import openai

    with openai.OpenAI(base_url=encoder_server.v1, api_key="unused", max_retries=0, timeout=120) as sdk:
        as_floats = sdk.embeddings.create(model=EMBEDDER, input=TEXTS, encoding_format="float")
        as_base64 = sdk.embeddings.create(model=EMBEDDER, input=TEXTS)  # the SDK asks for base64
    assert as_floats.object == "list" and as_floats.model == EMBEDDER
    assert [item.index for item in as_floats.data] == [0, 1, 2]
    expected_tokens = sum(len(ids_of(text)) for text in TEXTS)
    assert as_floats.usage.prompt_tokens == as_floats.usage.total_tokens == expected_tokens
    for text, got_float, got_base64 in zip(TEXTS, as_floats.data, as_base64.data):
        assert len(got_float.embedding) == 384
        want = reference(text)
        assert cosine(got_float.embedding, want) >= 0.9999, text
        assert cosine(got_base64.embedding, want) >= 0.9999, text
        assert np.allclose(got_float.embedding, got_base64.embedding, atol=1e-7)


def test_base64_is_little_endian_float32(encoder_server: RunningServer) -> None:
    response = embed(encoder_server, input="A man is eating food.", encoding_format="base64")
    assert response.status_code == 200, response.text
    raw = base64.b64decode(response.json()["data"][0]["embedding"])
    vector = np.frombuffer(raw, dtype="<f4")
    assert vector.shape == (384,)
    assert cosine(vector, reference("A man is eating food.")) >= 0.9999


def test_similar_sentences_are_closer_than_unrelated_ones(encoder_server: RunningServer) -> None:
    response = embed(
        encoder_server,
        input=["A man is eating food.", "A man is eating a piece of bread.", "The stock market fell today."],
    )
    food, bread, stocks = (np.asarray(item["embedding"]) for item in response.json()["data"])
    assert cosine(food, bread) > cosine(food, stocks) + 0.3


def test_token_ids_give_the_vector_of_their_text(encoder_server: RunningServer) -> None:
    texts = ["A man is eating food.", "hello world"]
    by_text = embed(encoder_server, input=texts).json()["data"]
    one = embed(encoder_server, input=ids_of(texts[0], special=False)).json()
    several = embed(encoder_server, input=[ids_of(text, special=False) for text in texts]).json()
    assert len(one["data"]) == 1 and len(several["data"]) == 2
    assert cosine(one["data"][0]["embedding"], by_text[0]["embedding"]) > 0.99999
    for got, want in zip(several["data"], by_text):
        assert cosine(got["embedding"], want["embedding"]) > 0.99999
    assert one["usage"]["prompt_tokens"] == len(ids_of(texts[0]))


def test_truncate_prompt_tokens_cuts_long_inputs(encoder_server: RunningServer) -> None:
    text = " ".join(["retrieval augmented generation on a small box"] * 60)
    assert len(ids_of(text)) > LIMIT
    cut = embed(encoder_server, input=text, truncate_prompt_tokens=16).json()
    assert cut["usage"]["prompt_tokens"] == 16
    weights, config, _ = embedded_files()
    content = ids_of(text, special=False)[:14]
    want = mean_pooled(weights, config, [ids_of("")[0], *content, ids_of("")[-1]])
    assert cosine(cut["data"][0]["embedding"], want) >= 0.9999
    at_limit = embed(encoder_server, input=[text, "short"], truncate_prompt_tokens=-1).json()
    assert at_limit["usage"]["prompt_tokens"] == LIMIT + len(ids_of("short"))


def _unmatched_ids() -> list[int]:
    """Token ids the tokenizer never makes of their own text: a word-piece suffix alone."""
    _, _, tokenizer = embedded_files()
    return [tokenizer.token_to_id("##ing")]


BAD_INPUTS = [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": ["fine", ""]}, "input[1]"),
    ({"input": [[1037], []]}, "input[1]"),
    ({"input": [-1, 5]}, "input[0]"),
    ({"input": [30522]}, "input"),
    ({"input": "x", "dimensions": 128}, "dimensions"),
    ({"input": "x", "encoding_format": "binary"}, "encoding_format"),
    ({"input": "x", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ({"input": ["x"] * (MAX_INPUTS + 1)}, "input"),
    ({"input": 42}, "input"),
]


@pytest.mark.parametrize(
    ("body", "param"), BAD_INPUTS, ids=[param + ":" + json.dumps(b)[:40] for b, param in BAD_INPUTS]
)
def test_bad_inputs_get_a_400_naming_them(encoder_server: RunningServer, body: dict[str, Any], param: str) -> None:
    error = assert_error(embed(encoder_server, **body), 400, param=param)
    assert error["message"]


def test_an_input_over_the_limit_is_refused_naming_it_and_the_limit(encoder_server: RunningServer) -> None:
    long_text = "word " * (LIMIT + 10)
    error = assert_error(embed(encoder_server, input=["short", long_text]), 400, param="input[1]")
    assert str(LIMIT) in error["message"] and "truncate_prompt_tokens" in error["message"]


def test_token_ids_that_are_not_their_texts_tokens_are_refused(encoder_server: RunningServer) -> None:
    assert_error(embed(encoder_server, input=[[1037, 2158], _unmatched_ids()]), 400, param="input[1]")


def test_models_of_another_kind_or_unknown(encoder_server: RunningServer) -> None:
    assert_error(
        post(encoder_server.base_url, "/v1/embeddings", {"model": MODEL, "input": "x"}),
        400,
        param="model",
        code="model_kind_mismatch",
    )
    assert_error(
        post(encoder_server.base_url, "/v1/embeddings", {"model": "nope", "input": "x"}),
        404,
        param="model",
        code="model_not_found",
    )
    assert_error(
        post(encoder_server.base_url, "/v1/rerank", {"model": EMBEDDER, "query": "q", "documents": ["d"]}),
        400,
        param="model",
        code="model_kind_mismatch",
    )
    chat = {"model": EMBEDDER, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    error = assert_error(
        post(encoder_server.base_url, "/v1/chat/completions", chat), 400, param="model", code="model_kind_mismatch"
    )
    assert "/v1/embeddings" in error["message"]


def test_the_embedder_is_listed_and_defaults_when_model_is_left_out(server: RunningServer) -> None:
    listed = httpx.get(server.v1 + "/models", timeout=30).json()
    assert EMBEDDER in [card["id"] for card in listed["data"]]
    response = post(server.base_url, "/v3/embeddings", {"input": "hello"})
    assert response.status_code == 200, response.text
    assert response.json()["model"] == EMBEDDER


def test_rerank_without_a_reranker_says_how_to_add_one(server: RunningServer) -> None:
    error = assert_error(post(server.base_url, "/v1/rerank", {"query": "q", "documents": ["d"]}), 404, param="model")
    assert "--rerank-model" in error["message"]


def _holder(server: RunningServer, results: list[httpx.Response]) -> threading.Thread:
    """A request that keeps the embedder busy for a while: many long inputs."""
    long_text = "the quick brown fox jumps over the lazy dog " * 11
    thread = threading.Thread(
        target=lambda: results.append(
            httpx.post(
                server.v1 + "/embeddings", json={"model": EMBEDDER, "input": [long_text] * HOLDER_INPUTS}, timeout=600
            )
        )
    )
    thread.start()
    return thread


@contextmanager
def _leaving_client(server: RunningServer, body: bytes) -> Iterator[None]:
    """A raw connection that has sent `body` to /v1/embeddings, and closes (its client
    leaves, unanswered) when the block ends."""
    host, port = server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as leaver:
        leaver.sendall(
            b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        yield


def _batches(server: RunningServer) -> float:
    return server.metric("ovtrio_encoder_batch_size_count", model_name=EMBEDDER)


def test_a_full_queue_gives_429_and_a_client_that_left_costs_nothing(encoder_server: RunningServer) -> None:
    embed(encoder_server, input="warm")  # loaded
    batches = _batches(encoder_server)
    inputs = encoder_server.metric("ovtrio_encoder_inputs_total", model_name=EMBEDDER)
    computed = encoder_server.metric("ovtrio_encoder_batch_size_sum", model_name=EMBEDDER)
    held: list[httpx.Response] = []
    holder = _holder(encoder_server, held)
    wait_for(lambda: _batches(encoder_server) > batches, "the holding request started")

    # A client that sends 7 inputs and leaves while they wait.
    body = json.dumps({"model": EMBEDDER, "input": ["left"] * 7}).encode()
    with _leaving_client(encoder_server, body):
        # It leaves at once: a large request is computed a batch at a time with waiting
        # requests between its batches, so this one's turn comes after one of the
        # holder's batches, and a client that leaves within that costs nothing.
        pass
    time.sleep(1.0)
    # The queue holds QUEUED requests; more than that come at once, and those beyond
    # are refused. The queue drains between two of the holder's batches (its waiting
    # requests share one batch), so some come as it drains: several more than QUEUED
    # come, so that some are refused however the arrivals and the batches interleave.
    arriving = QUEUED + 6
    waiting: list[httpx.Response] = []
    together = threading.Barrier(arriving)

    def send() -> None:
        together.wait()
        waiting.append(embed(encoder_server, input=["queued"]))

    threads = [threading.Thread(target=send) for _ in range(arriving)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    holder.join(timeout=600)
    assert held and held[0].status_code == 200, held[0].text if held else "no reply"
    statuses = sorted(response.status_code for response in waiting)
    assert 429 in statuses, statuses
    refused = next(response for response in waiting if response.status_code == 429)
    assert_error(refused, 429, param=None, type="requests", code="rate_limit_exceeded")
    assert int(refused.headers["Retry-After"]) >= 1
    served = sum(status == 200 for status in statuses)
    # The leaver's 7 inputs were never computed (no batch held them) nor counted.
    assert (
        encoder_server.metric("ovtrio_encoder_batch_size_sum", model_name=EMBEDDER) == computed + HOLDER_INPUTS + served
    )
    assert encoder_server.metric("ovtrio_encoder_inputs_total", model_name=EMBEDDER) == inputs + HOLDER_INPUTS + served
    assert encoder_server.metric("ovtrio_encoder_requests_rejected_total", model_name=EMBEDDER) >= 1


def _arriving_together(server: RunningServer, bodies: list[bytes]) -> list[int]:
    """Sends each body to /v1/embeddings on its own connection, all but the last byte
    first and then the last bytes of all of them one after another, so the requests are
    complete within microseconds of one another (threads started together can be
    milliseconds apart on a busy machine, long enough for a batch to fall between them).
    Returns the replies' status codes."""
    host, port = server.base_url.removeprefix("http://").split(":")
    connections = [socket.create_connection((host, int(port))) for _ in bodies]
    try:
        requests = [
            b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
            for body in bodies
        ]
        for connection, request in zip(connections, requests):
            connection.sendall(request[:-1])
        for connection, request in zip(connections, requests):
            connection.sendall(request[-1:])
        statuses = []
        for connection in connections:
            connection.settimeout(600)
            reply = b""
            while chunk := connection.recv(65536):
                reply += chunk
            statuses.append(int(reply.split(b" ", 2)[1]))
        return statuses
    finally:
        for connection in connections:
            connection.close()


def test_requests_that_arrive_together_share_a_batch(encoder_server: RunningServer) -> None:
    embed(encoder_server, input="warm")
    batches = _batches(encoder_server)
    held: list[httpx.Response] = []
    holder = _holder(encoder_server, held)
    wait_for(lambda: _batches(encoder_server) > batches, "the holding request started")
    body = json.dumps({"model": EMBEDDER, "input": "together"}).encode()
    statuses = _arriving_together(encoder_server, [body] * QUEUED)
    holder.join(timeout=600)
    assert held and held[0].status_code == 200, held[0].text if held else "no reply"
    assert statuses == [200] * QUEUED
    # The holder's parts (a batch each) and one batch of both waiting requests.
    assert _batches(encoder_server) == batches + HOLDER_INPUTS // 8 + 1


def test_langchain_openai_embeddings(encoder_server: RunningServer) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    embeddings = langchain_openai.OpenAIEmbeddings(
        model=EMBEDDER, base_url=encoder_server.v1, api_key="unused", check_embedding_ctx_length=False
    )
    documents = embeddings.embed_documents(TEXTS[:2])
    query = embeddings.embed_query(TEXTS[0])
    assert cosine(documents[0], reference(TEXTS[0])) >= 0.9999
    assert cosine(documents[1], reference(TEXTS[1])) >= 0.9999
    assert cosine(query, documents[0]) > 0.99999


DOCUMENTS = [
    "Bread is made of flour, water and yeast.",
    "The stock market fell today.",
    "A man is eating a piece of bread.",
    "Cats sleep most of the day.",
    "Eating food keeps people alive.",
]


@pytest.mark.parametrize("path", ["/v1/rerank", "/v3/rerank", "/rerank"])
def test_rerank_returns_the_scores_numpy_computes_sorted_and_cut(encoder_server: RunningServer, path: str) -> None:
    query = "what is bread made of"
    expected = expected_ranking(query, DOCUMENTS)
    documents: list[Any] = [DOCUMENTS[0], *({"text": text} for text in DOCUMENTS[1:])]
    response = post(
        encoder_server.base_url, path, {"model": RERANKER, "query": query, "documents": documents, "top_n": 3}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == RERANKER and body["usage"]["total_tokens"] > 0
    results = body["results"]
    assert [result["index"] for result in results] == [index for _, index in expected[:3]]
    for result, (score, index) in zip(results, expected):
        assert abs(result["relevance_score"] - score) < 1e-4
        assert result["document"] == {"text": DOCUMENTS[index]}
    scores = [result["relevance_score"] for result in results]
    assert scores == sorted(scores, reverse=True)
    without = post(encoder_server.base_url, path, {"query": query, "documents": DOCUMENTS, "return_documents": False})
    assert len(without.json()["results"]) == len(DOCUMENTS)
    assert all("document" not in result for result in without.json()["results"])


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"query": "", "documents": ["d"]}, "query"),
        ({"query": "q", "documents": []}, "documents"),
        ({"query": "q", "documents": ["d", ""]}, "documents[1]"),
        ({"query": "q", "documents": ["d"], "top_n": 0}, "top_n"),
        ({"query": "q", "documents": [{"title": "d"}]}, "documents[0].text"),
        ({"documents": ["d"]}, "query"),
    ],
)
def test_bad_rerank_requests_get_a_400_naming_the_field(
    encoder_server: RunningServer, body: dict[str, Any], param: str
) -> None:
    assert_error(post(encoder_server.base_url, "/v1/rerank", body), 400, param=param)


def test_the_hypercorn_entry_point_serves_embeddings_too(hypercorn_server: RunningServer) -> None:
    response = httpx.post(hypercorn_server.v1 + "/embeddings", json={"input": ["A man is eating food."]}, timeout=600)
    assert response.status_code == 200, response.text
    assert cosine(response.json()["data"][0]["embedding"], reference("A man is eating food.")) > 0.999


def expected_ranking(query: str, documents: list[str]) -> list[tuple[float, int]]:
    weights = reranker_weights()
    _, config, tokenizer = embedded_files()
    expected = []
    for index, document in enumerate(documents):
        encoding = tokenizer.encode(query, document)
        expected.append((cross_encoder_score(weights, config, encoding.ids, encoding.type_ids), index))
    return sorted(expected, key=lambda pair: (-pair[0], pair[1]))


# A query longer than its documents, three or more of them: calls of n documents whose
# tokens are fewer than (n - 2) times the query's broke the cross-encoder's tokenizer
# (docs/known-issues.md); the last ones sit just either side of that line.
CORRUPTING = [
    ("What is the capital city of France?", ["Paris", "Berlin", "Rome"]),
    ("paris " * 5, ["rome", "rome", "rome rome"]),
    ("paris " * 5, ["rome", "rome rome", "rome rome"]),
    ("paris " * 4, ["rome", "rome", "rome", "rome", "rome " * 7]),
    ("paris " * 4, ["rome", "rome", "rome", "rome", "rome " * 8]),
    ("paris " * 10, ["rome rome"] * 13),
    ("paris " * 9, ["rome " * 3, "rome", "rome " * 5, "rome", "rome rome", "rome"] * 4),
    ("what is bread made of " * 60, ["bread", "flour", "water", "salt", "yeast", "time"]),
]


def test_rerank_requests_that_corrupted_the_tokenizer_get_the_scores_numpy_computes(
    encoder_server: RunningServer,
) -> None:
    def hostile() -> None:
        for query, documents in CORRUPTING:
            response = post(
                encoder_server.base_url, "/v1/rerank", {"model": RERANKER, "query": query, "documents": documents}
            )
            assert response.status_code == 200, response.text
            results = response.json()["results"]
            expected = {index: score for score, index in expected_ranking(query, documents)}
            assert sorted(result["index"] for result in results) == list(range(len(documents)))
            for result in results:
                assert abs(result["relevance_score"] - expected[result["index"]]) < 1e-4
            scores = [result["relevance_score"] for result in results]
            assert scores == sorted(scores, reverse=True)

    beside_innocent_streams(encoder_server, hostile)
    assert encoder_server.process.poll() is None


def test_a_request_over_the_token_budget_is_refused_before_any_is_computed(encoder_server: RunningServer) -> None:
    embed(encoder_server, input="warm")
    post(encoder_server.base_url, "/v1/rerank", {"model": RERANKER, "query": "warm", "documents": ["up"]})
    batches = _batches(encoder_server)
    long_text = "the quick brown fox jumps over the lazy dog " * 11  # about 100 tokens
    replies: list[httpx.Response] = []

    def hostile() -> None:
        replies.append(embed(encoder_server, input=[long_text] * MAX_INPUTS))
        replies.append(
            post(
                encoder_server.base_url,
                "/v1/rerank",
                {"model": RERANKER, "query": long_text, "documents": [long_text] * MAX_INPUTS},
            )
        )

    beside_innocent_streams(encoder_server, hostile)
    for response, param in zip(replies, ["input", "documents"]):
        error = assert_error(response, 400, param=param)
        assert str(REQUEST_TOKENS) in error["message"]
    assert _batches(encoder_server) == batches  # nothing of it was computed
    # Under the budget, the same texts are served.
    assert embed(encoder_server, input=[long_text] * 20).status_code == 200


def _computed(server: RunningServer) -> float:
    return server.metric("ovtrio_encoder_batch_size_sum", model_name=EMBEDDER)


def test_a_large_request_stops_between_its_batches_when_its_client_leaves(encoder_server: RunningServer) -> None:
    embed(encoder_server, input="warm")
    batches = _batches(encoder_server)
    computed = _computed(encoder_server)
    long_text = "the quick brown fox jumps over the lazy dog " * 11
    body = json.dumps({"model": EMBEDDER, "input": [long_text] * HOLDER_INPUTS}).encode()
    with _leaving_client(encoder_server, body):
        wait_for(lambda: _batches(encoder_server) > batches, "the large request started")
    # Its client left during its first batches: what is computed next stops within one.
    time.sleep(3)
    settled = _computed(encoder_server)
    time.sleep(2)
    assert _computed(encoder_server) == settled
    assert settled - computed < HOLDER_INPUTS, "every input of the request was computed"
    assert embed(encoder_server, input="after").status_code == 200


def test_a_one_input_request_waits_for_a_batch_of_a_large_one_not_all_of_it(encoder_server: RunningServer) -> None:
    embed(encoder_server, input="warm")
    batches = _batches(encoder_server)
    held: list[httpx.Response] = []
    holder = _holder(encoder_server, held)
    wait_for(lambda: _batches(encoder_server) > batches, "the large request started")
    small = embed(encoder_server, input="small")
    assert small.status_code == 200
    assert holder.is_alive(), "the one-input request waited for all of the large one"
    # It was computed after the large one's first batch and before its last.
    assert _batches(encoder_server) < batches + HOLDER_INPUTS // 8 + 1
    holder.join(timeout=600)
    assert held and held[0].status_code == 200
    assert len(held[0].json()["data"]) == HOLDER_INPUTS


def test_a_one_document_rerank_waits_for_a_batch_of_a_large_one_not_all_of_it(encoder_server: RunningServer) -> None:
    def rerank(documents: list[str]) -> httpx.Response:
        body = {"model": RERANKER, "query": "what is bread made of", "documents": documents}
        return httpx.post(encoder_server.v1 + "/rerank", json=body, timeout=600)

    rerank(["warm"])
    batches = encoder_server.metric("ovtrio_encoder_batch_size_count", model_name=RERANKER)
    held: list[httpx.Response] = []
    documents = [f"{DOCUMENTS[index % len(DOCUMENTS)]} {index}" for index in range(MAX_INPUTS)]
    holder = threading.Thread(target=lambda: held.append(rerank(documents)))
    holder.start()
    wait_for(
        lambda: encoder_server.metric("ovtrio_encoder_batch_size_count", model_name=RERANKER) > batches,
        "the large request started",
    )
    small = rerank(["Flour, water and yeast."])
    assert small.status_code == 200
    assert holder.is_alive(), "the one-document request waited for all of the large one"
    holder.join(timeout=600)
    assert held and held[0].status_code == 200
    assert sorted(result["index"] for result in held[0].json()["results"]) == list(range(MAX_INPUTS))
