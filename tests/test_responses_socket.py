"""Responses WebSocket mode: the official SDK's responses.connect() and trio-websocket
against a real server; chaining with store=false, multiplexed responses, bad frames,
and a mid-stream close that frees the engine."""

from __future__ import annotations

import json
import time

import trio
from trio_websocket import open_websocket_url

from openai_schema import validate

MODEL = "SmolLM2-135M-Instruct"


def ws_url(server, path: str = "/v1/responses") -> str:
    return server.base_url.replace("http://", "ws://") + path


def test_sdk_connect_multi_turn_with_store_false(client):
    with client.responses.connect() as connection:
        connection.response.create(
            model=MODEL, input="My name is Ada.", max_output_tokens=12, temperature=0, store=False
        )
        first = _final(connection)
        connection.response.create(
            model=MODEL,
            input="What is my name?",
            previous_response_id=first.id,
            max_output_tokens=12,
            temperature=0,
            store=False,
        )
        second = _final(connection)
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    # store=false: nothing was kept beyond the connection.
    import openai
    import pytest

    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)


def _final(connection):
    text = ""
    for event in connection:
        assert event.type != "error", event
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type in ("response.completed", "response.incomplete"):
            assert event.response.output_text == text
            return event.response
    raise AssertionError("socket closed before the response ended")


async def receive_json(ws) -> dict:
    return json.loads(await ws.get_message())


async def receive_response(ws) -> list[dict]:
    """The events of one response, up to its last; a stalled socket fails the test."""
    events: list[dict] = []
    with trio.fail_after(60):
        while not events or events[-1]["type"] not in ("response.completed", "response.incomplete"):
            events.append(await receive_json(ws))
    return events


def comparable(event: dict) -> dict:
    """An event without what differs between two runs of the same response (ids, times)."""
    volatile = {"item_id", "response", "item"}
    return {key: value for key, value in event.items() if key not in volatile}


async def test_events_match_the_sse_stream_and_validate(server):
    fields = {"model": MODEL, "input": "Say hello.", "max_output_tokens": 8, "temperature": 0, "ignore_eos": True}
    async with open_websocket_url(ws_url(server, "/v3/responses")) as ws:
        await ws.send_message(json.dumps({"type": "response.create", **fields}))
        events = await receive_response(ws)
    for event in events:
        validate(event, "ResponseStreamEvent")
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created" and events[-1]["response"]["usage"]["output_tokens"] == 8
    from test_responses import stream_events

    over_http = await trio.to_thread.run_sync(lambda: stream_events(server, **fields))
    assert [comparable(e) for e in events] == [comparable(e) for e in over_http]
    assert events[-1]["response"]["output"][0]["content"] == over_http[-1]["response"]["output"][0]["content"]


async def test_two_multiplexed_responses_on_one_socket(server):
    async with open_websocket_url(ws_url(server)) as ws:
        for stream_id, text in (("a", "Tell me about cats."), ("b", "Tell me about dogs.")):
            await ws.send_message(
                json.dumps(
                    {
                        "type": "response.create",
                        "stream_id": stream_id,
                        "model": MODEL,
                        "input": text,
                        "max_output_tokens": 16,
                        "ignore_eos": True,
                        "temperature": 0,
                    }
                )
            )
        events: dict[str, list[dict]] = {"a": [], "b": []}
        finished = set()
        while finished != {"a", "b"}:
            event = await receive_json(ws)
            events[event["stream_id"]].append(event)
            if event["type"] in ("response.completed", "response.incomplete"):
                finished.add(event["stream_id"])
    for stream_id, stream in events.items():
        assert [e["sequence_number"] for e in stream] == list(range(len(stream)))
        assert stream[-1]["response"]["usage"]["output_tokens"] == 16
        assert all(e["stream_id"] == stream_id for e in stream)
    ids = {stream[-1]["response"]["id"] for stream in events.values()}
    assert len(ids) == 2


async def test_bad_frames_get_error_events_and_the_socket_stays_usable(server):
    async with open_websocket_url(ws_url(server)) as ws:
        for frame, param in [
            ("{not json", None),
            ("[1, 2]", None),
            (json.dumps({"type": "response.cancel"}), "type"),
            (json.dumps({"type": "response.create", "model": MODEL, "input": "x", "temperature": 5}), "temperature"),
            (json.dumps({"type": "response.create", "model": "nope", "input": "x"}), "model"),
            (
                json.dumps({"type": "response.create", "model": MODEL, "input": "x", "previous_response_id": "resp_x"}),
                "previous_response_id",
            ),
            ("x" * (5 * 1024 * 1024), None),
            # Nesting far beyond any parser's depth: refused like the same HTTP body.
            ('{"type": "response.create", "input": ' + "[" * 10_000 + "]" * 10_000 + "}", None),
            ("[" * 10_000, None),
            (b"\xff\xfe not UTF-8", None),
        ]:
            await ws.send_message(frame)
            with trio.fail_after(30):
                event = await receive_json(ws)
            validate(event, "ResponseErrorEvent")
            assert event["type"] == "error" and event["param"] == param, event
        await ws.send_message(
            json.dumps(
                {
                    "type": "response.create",
                    "model": MODEL,
                    "input": "Hi",
                    "max_output_tokens": 4,
                    "temperature": 0,
                    "ignore_eos": True,
                }
            )
        )
        events = await receive_response(ws)
        assert [e["type"] for e in events if e["type"] == "error"] == []
        assert events[-1]["type"] == "response.incomplete"
        assert events[-1]["response"]["usage"]["output_tokens"] == 4


def test_closing_the_socket_cancels_its_engine_requests(server):
    async def open_and_leave() -> None:
        async with open_websocket_url(ws_url(server)) as ws:
            for stream_id in ("x", "y"):
                await ws.send_message(
                    json.dumps(
                        {
                            "type": "response.create",
                            "stream_id": stream_id,
                            "model": MODEL,
                            "input": "Write a very long story.",
                            "max_output_tokens": 3000,
                            "ignore_eos": True,
                        }
                    )
                )
            deltas = 0
            while deltas < 6:
                if (await receive_json(ws))["type"] == "response.output_text.delta":
                    deltas += 1
            assert server.metric("ovtrio_engine_requests") == 2

    generated = server.metric("ovtrio_generated_tokens_total")
    trio.run(open_and_leave)
    deadline = time.monotonic() + 300  # a cap for a hang
    while server.metric("ovtrio_engine_requests") != 0 or server.metric("ovtrio_requests_running") != 0:
        assert time.monotonic() < deadline, "the engine kept the closed socket's requests"
        time.sleep(0.05)
    # Both ended when the socket closed, far short of their 3000 tokens each.
    assert server.metric("ovtrio_generated_tokens_total") - generated < 3000
    before = server.metric("ovtrio_generated_tokens_total")
    time.sleep(1)
    assert server.metric("ovtrio_generated_tokens_total") == before


async def test_one_socket_runs_at_most_sixteen_responses(server):
    async with open_websocket_url(ws_url(server)) as ws:
        for i in range(17):
            await ws.send_message(
                json.dumps(
                    {
                        "type": "response.create",
                        "stream_id": i,
                        "model": MODEL,
                        "input": "Write a long story.",
                        "max_output_tokens": 500,
                        "ignore_eos": True,
                    }
                )
            )
        refused = None
        with trio.fail_after(30):
            while refused is None:
                event = await receive_json(ws)
                if event["type"] == "error":
                    refused = event
        validate(refused, "ResponseErrorEvent")
        assert refused["code"] == "too_many_responses" and refused["stream_id"] == 16
    # Closing the socket cancelled the sixteen running ones.
    with trio.fail_after(10):
        while server.metric("ovtrio_engine_requests") != 0:
            await trio.sleep(0.05)
