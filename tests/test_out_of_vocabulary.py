"""A model whose output layer has more rows than its vocabulary (padded for speed, or a
broken export) can produce a token id no text belongs to. That request fails alone, with
a 500 that says so (an error event in a stream), and the model keeps serving: beside it
three streams finish, and the next request succeeds.

The model is the embedded one with an output layer of twice its vocabulary
(gguf_files.padded_output): its greedy choices stay within the vocabulary, so the
innocent streams (greedy) are safe, while a sampled reply picks an id past it about one
token in four, so 64 sampled tokens without an end of sequence hold one for certain (a
chance of about 1e-8 that they do not, on any machine).
"""

from __future__ import annotations

import json

import pytest

import loopback
from conftest import sample_value
from gguf_files import padded_output
from helpers import assert_error, beside_innocent_streams, post
from server_pool import server_fixture

PADDED = "padded"
VOCABULARY = 49152  # the embedded model's

padded_server = server_fixture(
    "padded_server",
    "--model",
    "{folder}/padded.gguf",
    "--served-model-name",
    PADDED,
    prepare=lambda folder: padded_output(folder / "padded.gguf"),
)

SAMPLED = {
    "model": PADDED,
    "messages": [{"role": "user", "content": "Write a story."}],
    "max_tokens": 64,
    "ignore_eos": True,
    "temperature": 1.0,
    "seed": 7,
}


def check_outside_vocabulary(error: dict) -> None:
    assert error["type"] == "server_error", error
    assert error["code"] == "token_outside_vocabulary", error
    assert f"outside its vocabulary of {VOCABULARY} tokens" in error["message"], error


def sampled_stream(base_url: str) -> list[dict]:
    """The data events of a sampled stream, read to its end."""
    with loopback.stream("POST", base_url + "/v1/chat/completions", json={**SAMPLED, "stream": True}, timeout=600) as r:
        assert r.status_code == 200, r.read()
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]", lines[-3:]
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_a_token_outside_the_vocabulary_fails_its_request_alone(padded_server, stream):
    failures = []

    def hostile() -> None:
        if stream:
            events = sampled_stream(padded_server.base_url)
            assert "error" in events[-1], events[-1]
            check_outside_vocabulary(events[-1]["error"])
            failures.append(events[-1])
        else:
            reply = post(padded_server.base_url, "/v1/chat/completions", SAMPLED)
            failures.append(assert_error(reply, 500, param=None, type="server_error"))
            check_outside_vocabulary(failures[-1])
        assert loopback.get(padded_server.base_url + "/health/ready", timeout=30).status_code == 200

    beside_innocent_streams(padded_server, hostile, model=PADDED)
    assert len(failures) == 1
    after = post(padded_server.base_url, "/v1/chat/completions", {**SAMPLED, "temperature": 0, "max_tokens": 4})
    assert after.status_code == 200, after.text
    assert after.json()["usage"]["completion_tokens"] == 4
    metrics = loopback.get(padded_server.base_url + "/metrics", timeout=30).text
    assert sample_value(metrics, "ovtrio_requests_running", model_name=PADDED) == 0
