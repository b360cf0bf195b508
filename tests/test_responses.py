"""The Responses API, unary: /v1/responses and /v3/responses through the official SDK and
raw HTTP; every body validates against OpenAI's `Response` schema."""

from __future__ import annotations

import json

import jsonschema
import pytest

import loopback
from helpers import ENDS_BY_ITSELF, post
from openai_schema import validate

MODEL = "SmolLM2-135M-Instruct"
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]},
}


def create(server, path: str = "/v1/responses", **fields) -> dict:
    reply = post(server.base_url, path, {"model": MODEL, "temperature": 0, **fields})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    validate(body, "Response")
    return body


# A reply that completes by itself on any CPU: the schema admits only true or false,
# then the model can only end (see helpers.ENDS_BY_ITSELF).
COMPLETES = {
    "input": ENDS_BY_ITSELF["messages"][0]["content"],
    "text": {"format": {"type": "json_schema", "name": "answer", "schema": {"type": "boolean"}}},
    "max_output_tokens": 60,
}


def texts(body: dict) -> list[str]:
    return [part["text"] for item in body["output"] if item["type"] == "message" for part in item["content"]]


@pytest.mark.parametrize("path", ["/v1/responses", "/v3/responses"])
def test_text_response(server, path):
    body = create(server, path, input="What is the capital of France?", max_output_tokens=24, ignore_eos=True)
    assert body["object"] == "response" and body["id"].startswith("resp_")
    assert body["status"] == "incomplete"
    assert len(texts(body)) == 1
    usage = body["usage"]
    assert usage["output_tokens"] == 24
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    completed = create(server, path, **COMPLETES)
    assert completed["status"] == "completed" and json.loads(texts(completed)[0]) in (True, False)


def test_sdk_create_and_output_text(client):
    params = {"model": MODEL, "input": "Say hello.", "max_output_tokens": 16, "temperature": 0}
    reply = client.responses.create(**params, extra_body={"ignore_eos": True})
    assert reply.usage.output_tokens == 16
    assert reply.output_text == texts(reply.model_dump())[0]
    again = client.responses.create(**params, extra_body={"ignore_eos": True})
    assert again.output_text == reply.output_text  # greedy is deterministic


def test_truncation_is_incomplete_with_max_output_tokens(server):
    body = create(server, input="Tell me a long story.", max_output_tokens=4, ignore_eos=True)
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["usage"]["output_tokens"] == 4
    assert body["max_output_tokens"] == 4


def test_instructions_reach_the_model(server):
    short = "You are a pirate."
    long = short + " Answer every question like an old sea captain would, with sea stories." * 3
    brief = create(server, input="Hi", instructions=short, max_output_tokens=1)
    instructed = create(server, input="Hi", instructions=long, max_output_tokens=1)
    assert instructed["usage"]["input_tokens"] > brief["usage"]["input_tokens"] + 20
    assert instructed["instructions"] == long


def test_message_items_and_parts(server):
    """Message items and their parts make the same prompt as the chat messages they
    stand for: same token count and (greedy) the same reply."""
    body = create(
        server,
        input=[
            {"role": "system", "content": "Be brief."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Name a color."}]},
        ],
        max_output_tokens=8,
        ignore_eos=True,
    )
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."}]
    reply = post(
        server.base_url,
        "/v1/chat/completions",
        {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0, "ignore_eos": True},
    ).json()
    assert body["usage"]["input_tokens"] == reply["usage"]["prompt_tokens"]
    assert texts(body) == [reply["choices"][0]["message"]["content"]]


def test_forced_function_call(server):
    body = create(
        server,
        input="What is the weather in Paris?",
        tools=[WEATHER_TOOL],
        tool_choice="required",
        max_output_tokens=60,
    )
    calls = [item for item in body["output"] if item["type"] == "function_call"]
    assert calls and calls[0]["name"] == "get_weather" and calls[0]["call_id"].startswith("call_")
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER_TOOL["parameters"])
    assert body["tools"][0]["name"] == "get_weather" and body["tool_choice"] == "required"


def test_tool_choice_is_reported_as_sent_or_openais_default(server):
    assert create(server, input="Hi", max_output_tokens=1)["tool_choice"] == "auto"
    assert create(server, input="Hi", tools=[WEATHER_TOOL], max_output_tokens=1)["tool_choice"] == "auto"
    assert (
        create(server, input="Hi", tools=[WEATHER_TOOL], tool_choice="none", max_output_tokens=1)["tool_choice"]
        == "none"
    )


def test_function_call_history_is_accepted(server):
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21 degrees"},
    ]
    short = create(server, input=history[:1], tools=[WEATHER_TOOL], tool_choice="none", max_output_tokens=1)
    full = create(server, input=history, tools=[WEATHER_TOOL], tool_choice="none", max_output_tokens=1)
    assert full["usage"]["input_tokens"] > short["usage"]["input_tokens"] + 10


@pytest.mark.parametrize("format_field", ["text", "response_format"])
def test_structured_output_in_either_field(server, format_field):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}},
        "required": ["name"],
        "additionalProperties": False,
    }
    if format_field == "text":
        fields = {"text": {"format": {"type": "json_schema", "name": "person", "schema": schema}}}
    else:
        fields = {"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}}
    body = create(server, input="Describe a person.", max_output_tokens=60, **fields)
    jsonschema.validate(json.loads(texts(body)[0]), schema)
    assert body["text"]["format"]["type"] == "json_schema" and body["text"]["format"]["name"] == "person"


def test_echoed_settings(server):
    body = create(server, input="Hi", max_output_tokens=2, top_p=0.5, metadata={"k": "v"}, store=False)
    assert (body["temperature"], body["top_p"], body["metadata"], body["store"]) == (0, 0.5, {"k": "v"}, False)
    assert body["text"] == {"format": {"type": "text"}} and body["truncation"] == "disabled"


BAD = [
    (
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
        "input[0].content[0].image_url",
    ),
    ({"input": "x", "max_tokens": 5}, "max_tokens"),
    ({"input": []}, "input"),
    ({}, "input"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0]"),
    (
        {"input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "nope"}}}},
        "text.format.schema",
    ),
    ({"input": "x", "tool_choice": "required"}, "tool_choice"),
    ({"input": "x", "stream": True, "n": 2}, "n"),
]


@pytest.mark.parametrize("fields, param", BAD)
def test_bad_requests_are_a_400_naming_the_field(server, fields, param):
    reply = post(server.base_url, "/v1/responses", {"model": MODEL, **fields})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


def test_unknown_model_is_a_404(server):
    reply = post(server.base_url, "/v1/responses", {"model": "nope", "input": "x"})
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "model_not_found"


# ---- streaming ----------------------------------------------------------------------------

TEXT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]
CALL_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.output_item.done",
]


def stream_events(server, **fields) -> list[dict]:
    """The events of a streamed response: `event:` and `data:` lines, then [DONE]."""
    body = {"model": MODEL, "temperature": 0, "stream": True, **fields}
    with loopback.stream("POST", server.base_url + "/v1/responses", json=body, timeout=60) as reply:
        raw = reply.read().decode()
    assert reply.status_code == 200, raw
    blocks = raw.strip().split("\n\n")
    assert blocks[-1] == "data: [DONE]"
    events = []
    for block in blocks[:-1]:
        name, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        validate(event, "ResponseStreamEvent")
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def collapsed(events: list[dict]) -> list[str]:
    """Event types with runs of the same delta event counted once."""
    kinds: list[str] = []
    for event in events:
        if not (kinds and kinds[-1] == event["type"] and event["type"].endswith(".delta")):
            kinds.append(event["type"])
    return kinds


def test_streamed_text_events_in_order_and_equal_to_unary(server):
    fields = COMPLETES
    events = stream_events(server, **fields)
    assert collapsed(events) == [*TEXT_EVENTS, "response.completed"]
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    done = next(e for e in events if e["type"] == "response.output_text.done")
    final = events[-1]["response"]
    assert text == done["text"] == final["output"][0]["content"][0]["text"] == texts(create(server, **fields))[0]
    assert events[0]["response"]["status"] == "in_progress" and final["status"] == "completed"
    assert final["usage"]["output_tokens"] > 0


def test_streamed_truncation_ends_with_response_incomplete(server):
    events = stream_events(server, input="Tell me a long story.", max_output_tokens=5, ignore_eos=True)
    assert collapsed(events) == [*TEXT_EVENTS, "response.incomplete"]
    final = events[-1]["response"]
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["usage"]["output_tokens"] == 5


def test_streamed_function_call_events(server):
    fields = {
        "input": "What is the weather in Paris?",
        "tools": [WEATHER_TOOL],
        "tool_choice": "required",
        "max_output_tokens": 60,
    }
    events = stream_events(server, **fields)
    assert collapsed(events)[:6] == CALL_EVENTS and events[-1]["type"] == "response.completed"
    added = events[2]["item"]
    arguments = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert added["type"] == "function_call" and added["name"] == "get_weather" and added["arguments"] == ""
    assert arguments == done["arguments"] == events[-1]["response"]["output"][0]["arguments"]
    jsonschema.validate(json.loads(arguments), WEATHER_TOOL["parameters"])


def test_sdk_stream_helper(client):
    with client.responses.stream(model=MODEL, temperature=0, **COMPLETES) as stream:
        text = "".join(event.delta for event in stream if event.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert text and final.output_text == text and final.status == "completed"


def test_logprobs_unary_and_streamed(server):
    fields = {"input": "Say hello.", "max_output_tokens": 8, "logprobs": True, "ignore_eos": True}
    unary = create(server, **fields)
    part = unary["output"][0]["content"][0]
    assert len(part["logprobs"]) == 8 and all(entry["logprob"] <= 0 for entry in part["logprobs"])
    events = stream_events(server, **fields)
    streamed = [entry for e in events if e["type"] == "response.output_text.delta" for entry in e["logprobs"]]
    assert [e["token"] for e in streamed] == [e["token"] for e in part["logprobs"]]


def test_engine_failure_ends_the_stream_with_response_failed():
    """Pure logic (the engine fails only on faults the server cannot provoke from
    outside): an engine error mid-stream closes the open item and ends with a
    response.failed event that validates."""
    from pydantic_core import to_jsonable_python

    from ovtrio.api.responses.events import ResponseEvents
    from ovtrio.output import TextDelta
    from ovtrio.scheduler import Failed

    writer = ResponseEvents(create_envelope)
    events = writer.opening()
    events += writer.write([TextDelta(0, "Hel")])
    events += writer.write([Failed("engine error", "engine_error")])
    events = to_jsonable_python(events)
    for event in events:
        validate(event, "ResponseStreamEvent")
    assert [e["type"] for e in events][-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.failed",
    ]
    assert events[-1]["response"]["status"] == "failed" and events[-1]["response"]["error"]["message"] == "engine error"


def create_envelope(status, output, usage, incomplete, error):
    from functools import partial

    from ovtrio.api.responses.body import response_envelope
    from ovtrio.api.responses.protocol import ResponsesRequest

    body = ResponsesRequest.model_validate({"model": MODEL, "input": "x"})
    return partial(response_envelope, body, "resp_test", 0, MODEL)(status, output, usage, incomplete, error)
