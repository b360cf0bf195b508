"""Log-probabilities on the Responses API, streamed and unary: the same greedy request
laid out both ways carries the same output items and, token for token, the same
log-probabilities (the streamed deltas add up to the done events and the final
response). Compared with each other, never with what the model writes."""

from __future__ import annotations

import pytest

from helpers import post
from openai_schema import validate
from test_responses import COMPLETES, MODEL, stream_events

CASES = {
    # Ends by itself (a boolean schema): the reply's last token, the end of text,
    # adds no text but has a log-probability.
    "ends_by_itself": COMPLETES,
    # Cut by max_output_tokens: every token adds text.
    "truncated": {"input": "Tell me a long story.", "max_output_tokens": 6, "ignore_eos": True},
}


def tokens(entries: list[dict]) -> list[tuple[str, list[int]]]:
    return [(entry["token"], entry["bytes"]) for entry in entries]


def values(entries: list[dict]) -> list[float]:
    return [entry["logprob"] for entry in entries]


def shape(response: dict) -> list[tuple]:
    """The output items' types, statuses and parts, without ids or text."""
    return [
        (item["type"], item.get("status"), [(p["type"], len(p.get("logprobs", []))) for p in item.get("content", [])])
        for item in response["output"]
    ]


@pytest.mark.parametrize("case", CASES)
def test_streamed_and_unary_logprobs_agree(server, case):
    fields = {"model": MODEL, "temperature": 0, "logprobs": True, **CASES[case]}
    reply = post(server.base_url, "/v1/responses", fields)
    assert reply.status_code == 200, reply.text
    unary = reply.json()
    validate(unary, "Response")
    events = stream_events(server, **CASES[case], logprobs=True)
    streamed = events[-1]["response"]
    assert streamed["status"] == unary["status"]
    assert shape(streamed) == shape(unary)
    unary_entries = unary["output"][-1]["content"][0]["logprobs"]
    # Every generated token has its entry, in order, the reply's last one included.
    assert len(unary_entries) == unary["usage"]["output_tokens"] == streamed["usage"]["output_tokens"]

    deltas = [entry for e in events if e["type"] == "response.output_text.delta" for entry in e["logprobs"]]
    done = next(e for e in events if e["type"] == "response.output_text.done")["logprobs"]
    part_done = next(e for e in events if e["type"] == "response.content_part.done")["part"]["logprobs"]
    final = streamed["output"][-1]["content"][0]["logprobs"]
    for entries in (deltas, done, part_done, final):
        assert tokens(entries) == tokens(unary_entries)
        assert values(entries) == pytest.approx(values(unary_entries), abs=1e-3)


def test_include_output_text_logprobs_asks_for_them(server):
    """OpenAI's way to ask (`include`) gives what `logprobs: true` gives."""
    case = CASES["truncated"]
    by_flag = post(server.base_url, "/v1/responses", {"model": MODEL, "temperature": 0, "logprobs": True, **case})
    by_include = post(
        server.base_url,
        "/v1/responses",
        {"model": MODEL, "temperature": 0, "include": ["message.output_text.logprobs"], **case},
    )
    assert by_flag.status_code == by_include.status_code == 200, by_include.text
    expected = by_flag.json()["output"][-1]["content"][0]["logprobs"]
    got = by_include.json()["output"][-1]["content"][0]["logprobs"]
    assert len(got) == len(expected) > 0
    assert tokens(got) == tokens(expected)
    assert values(got) == pytest.approx(values(expected), abs=1e-3)
    plain = post(server.base_url, "/v1/responses", {"model": MODEL, "temperature": 0, **case}).json()
    assert plain["output"][-1]["content"][0].get("logprobs") in (None, [])


def test_an_unknown_include_value_is_refused(server):
    reply = post(server.base_url, "/v1/responses", {"model": MODEL, "input": "hi", "include": ["message.everything"]})
    assert reply.status_code == 400
    assert reply.json()["error"]["param"].startswith("include")
