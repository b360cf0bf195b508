"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) driven with the
official `anthropic` SDK and raw HTTP against real servers: replies, structured output,
streams walked as a state machine and compared with the unary reply, a forced tool
loop, token counting, thinking blocks, stop sequences, every error class the SDK
raises, and a disconnect freeing the engine request; API keys, pings while queued and
the full queue's 429 on an in-process server, whose fake engine is held mid-generation.

Nothing here asserts what the model writes: streams are compared with unary replies of
the same greedy request on a server proven exact (conftest.EXACT_REPEATS), and
behaviour is forced through the API (tool_choice, output_config.format, max_tokens).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest
import trio

import loopback
from conftest import MODEL, RunningServer
from held_steps import held_steps
from helpers import pick_stop_word
from in_process import InProcessServer, in_process_server
from messages_stream import check_message, parse_named_sse, walk
from server_pool import server_fixture

GREEDY = {"extra_body": {"temperature": 0}}
STORY = [{"role": "user", "content": "Tell me a short story about a lighthouse keeper."}]
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "The current weather of a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 24}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
TIME_TOOL = {
    "name": "get_time",
    "description": "The local time in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 24}},
        "required": ["city"],
    },
}
# A schema whose every valid reply ends: the JSON grammar lets an object's reply pad
# itself with whitespace until max_tokens, which some CPUs' greedy choices do.
ANSWER = {"type": "string", "enum": ["sunny", "cloudy", "rainy"]}
# A reply of `true` or `false` and then the end (the schema leaves nothing else).
BOOLEAN = {"format": {"type": "json_schema", "schema": {"type": "boolean"}}}
IS_IT = [{"role": "user", "content": "Is the sky blue? Answer true or false."}]

# The template of test_reasoning_api.py (the same server serves both modules): it opens
# <think> when enable_thinking is on, which turns the reasoning parser on.
THINKING_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking %}<think>\n{% endif %}{% endif %}"
)
thinking_server = server_fixture(
    "thinking_server", "--chat-template", "{template.jinja}", files={"template.jinja": THINKING_TEMPLATE}
)

KEY = "messages-key"
# Keys on, and room for one running request and one waiting: for refusals and pings,
# which the HTTP layer decides (in process, over a fake engine held mid-generation).
messages_limited_server = in_process_server(
    "messages_limited_server", "--api-key", KEY, "--max-running-sequences", "1", "--max-queued-requests", "1"
)


def sdk(server: RunningServer | InProcessServer, key: str = "unused", **options: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key=key, max_retries=0, timeout=120, **options)


@pytest.fixture(scope="module")
def claude(server):
    with sdk(server) as client:
        yield client


def raw_stream(
    server: RunningServer, body: dict[str, Any], headers: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    with loopback.stream(
        "POST", server.base_url + "/v1/messages", json={**body, "stream": True}, headers=headers, timeout=120
    ) as reply:
        raw = reply.read().decode()
    assert reply.status_code == 200, raw
    assert reply.headers["content-type"].startswith("text/event-stream")
    return parse_named_sse(raw)


def message_body(messages: list[dict[str, Any]] = STORY, **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 16, "messages": messages, "temperature": 0, **fields}


# ---- replies ----------------------------------------------------------------------------


def test_create_returns_a_message(claude):
    reply = claude.messages.create(model=MODEL, max_tokens=8, messages=STORY, **GREEDY)
    body = reply.model_dump()
    check_message(body)
    assert reply.model == MODEL
    assert [block.type for block in reply.content] == ["text"]
    assert reply.stop_reason in ("end_turn", "max_tokens") and reply.stop_sequence is None
    assert 0 < reply.usage.output_tokens <= 8
    if reply.stop_reason == "max_tokens":
        assert reply.usage.output_tokens == 8


def test_v1_and_v3_answer_alike_with_or_without_anthropic_version(server):
    replies = [
        loopback.post(server.base_url + path, json=message_body(), headers=headers, timeout=60)
        for path, headers in (("/v1/messages", {}), ("/v3/messages", {"anthropic-version": "2023-06-01"}))
    ]
    for reply in replies:
        assert reply.status_code == 200, reply.text
        check_message(reply.json())
    first, second = (r.json() for r in replies)
    assert first["content"] == second["content"] and first["usage"] == second["usage"]


def test_system_and_sampling_fields_are_read(claude):
    short = claude.messages.create(model=MODEL, max_tokens=4, messages=STORY, system="Be brief.", **GREEDY)
    longer = claude.messages.create(
        model=MODEL,
        max_tokens=4,
        messages=STORY,
        **GREEDY,
        system=[{"type": "text", "text": "Be brief. "}, {"type": "text", "text": "Answer in English."}],
    )
    assert longer.usage.input_tokens > short.usage.input_tokens
    # temperature, top_p, top_k and metadata.user_id are accepted (older clients send them)
    sampled = claude.messages.create(
        model=MODEL,
        max_tokens=4,
        messages=STORY,
        metadata={"user_id": "u-1"},
        extra_body={"temperature": 0.7, "top_p": 0.9, "top_k": 40},
    )
    assert sampled.usage.output_tokens <= 4


def test_output_config_format_gives_schema_valid_json(claude):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    reply = claude.messages.create(
        model=MODEL,
        max_tokens=200,
        messages=messages,
        output_config={"format": {"type": "json_schema", "schema": ANSWER}},
        **GREEDY,
    )
    assert reply.stop_reason == "end_turn", reply
    jsonschema.validate(json.loads(reply.content[0].text), ANSWER)
    # Sampled too (a schema that leaves no room for the whitespace a sampled reply may pad an object with).
    for _ in range(3):
        reply = claude.messages.create(model=MODEL, max_tokens=40, messages=IS_IT, output_config=BOOLEAN)
        assert reply.stop_reason == "end_turn", reply
        assert isinstance(json.loads(reply.content[0].text), bool)


def test_a_trailing_assistant_message_is_continued(claude):
    base = claude.messages.count_tokens(model=MODEL, messages=STORY).input_tokens
    prefill = STORY + [{"role": "assistant", "content": "Once upon a time"}]
    reply = claude.messages.create(model=MODEL, max_tokens=4, messages=prefill, **GREEDY)
    # The prompt is the conversation with the assistant's turn opened, then the prefill.
    assert reply.usage.input_tokens == claude.messages.count_tokens(model=MODEL, messages=prefill).input_tokens
    assert reply.usage.input_tokens > base


# ---- streams ----------------------------------------------------------------------------


def test_sdk_stream_matches_unary(claude):
    unary = claude.messages.create(model=MODEL, max_tokens=24, messages=STORY, **GREEDY)
    with claude.messages.stream(model=MODEL, max_tokens=24, messages=STORY, **GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == unary.content[0].text
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in unary.content]
    assert (final.stop_reason, final.stop_sequence) == (unary.stop_reason, unary.stop_sequence)
    assert final.usage.input_tokens == unary.usage.input_tokens
    assert final.usage.output_tokens == unary.usage.output_tokens


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"tools": [WEATHER_TOOL, TIME_TOOL], "tool_choice": {"type": "any"}, "max_tokens": 200},
        {"tools": [WEATHER_TOOL], "tool_choice": {"type": "tool", "name": "get_weather"}, "max_tokens": 160},
        {"output_config": BOOLEAN, "messages": IS_IT},
    ],
    ids=["text", "any-tool", "named-tool", "format"],
)
def test_every_streamed_event_is_valid_and_in_order(server, fields):
    body = message_body(**{"max_tokens": 24, **fields})
    unary = loopback.post(server.base_url + "/v1/messages", json=body, timeout=120)
    assert unary.status_code == 200, unary.text
    streamed = walk(raw_stream(server, body))
    expected = unary.json()
    for block in streamed["content"] + expected["content"]:
        block.pop("id", None)  # tool_use ids differ from one request to the next
    assert streamed["content"] == expected["content"]
    assert streamed["stop_reason"] == expected["stop_reason"]
    assert streamed["usage"] == expected["usage"]
    if "tools" in fields:
        assert streamed["stop_reason"] == "tool_use"
        for block in streamed["content"]:
            assert block["type"] == "tool_use"
            schema = next(t for t in fields["tools"] if t["name"] == block["name"])["input_schema"]
            jsonschema.validate(block["input"], schema)


def test_stop_sequences_end_the_reply_and_are_named(claude, server):
    full = claude.messages.create(model=MODEL, max_tokens=40, messages=STORY, **GREEDY)
    text = full.content[0].text
    word, at = pick_stop_word(text)
    reply = claude.messages.create(
        model=MODEL, max_tokens=40, messages=STORY, stop_sequences=[word, "\u2603"], **GREEDY
    )
    assert (reply.stop_reason, reply.stop_sequence) == ("stop_sequence", word)
    assert reply.content[0].text == text[:at]
    streamed = walk(raw_stream(server, message_body(max_tokens=40, stop_sequences=[word, "\u2603"])))
    assert streamed["content"][0]["text"] == text[:at]
    assert (streamed["stop_reason"], streamed["stop_sequence"]) == ("stop_sequence", word)


# ---- tools ------------------------------------------------------------------------------


def test_a_forced_tool_loop(claude):
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    # Room for the whitespace a call's JSON may be padded with: the call ends well before.
    call = claude.messages.create(
        model=MODEL,
        max_tokens=160,
        messages=question,
        tools=[WEATHER_TOOL, TIME_TOOL],
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        **GREEDY,
    )
    assert call.stop_reason == "tool_use"
    [use] = call.content
    assert use.type == "tool_use" and use.name == "get_weather" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, WEATHER_TOOL["input_schema"])

    result = {"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "Sunny, 21 C"}]}
    history = question + [{"role": "assistant", "content": call.content}, {"role": "user", "content": [result]}]
    answer = claude.messages.create(
        model=MODEL, max_tokens=16, messages=history, tools=[WEATHER_TOOL], tool_choice={"type": "none"}, **GREEDY
    )
    assert [block.type for block in answer.content] == ["text"]
    assert answer.stop_reason in ("end_turn", "max_tokens")
    # The call and its result are in the prompt: the answer's prompt is the longer.
    alone = claude.messages.count_tokens(
        model=MODEL, messages=question, tools=[WEATHER_TOOL], tool_choice={"type": "none"}
    )
    assert answer.usage.input_tokens > alone.input_tokens

    # An error result is marked as one; string content reads like a text block.
    as_string = [*history[:2], {"role": "user", "content": [{**result, "content": "Sunny, 21 C"}]}]
    as_error = [*history[:2], {"role": "user", "content": [{**result, "is_error": True}]}]

    def count(messages):
        return claude.messages.count_tokens(model=MODEL, messages=messages).input_tokens

    assert count(as_string) == count(history)
    assert count(as_error) > count(history)


@pytest.mark.parametrize("stream", [False, True])
def test_the_sdks_tool_runner_runs_its_tools(claude, stream):
    """The SDK's tool runner asks for a message thread first (`"thread": {"type":
    "create"}`); refused with the error it falls back on, it sends the whole conversation
    without one, runs the tool on each call and sends its result back."""
    cities: list[str] = []

    @anthropic.beta_tool
    def get_weather(city: str) -> str:
        """The current weather of a city."""
        cities.append(city)
        return "Sunny, 21 C"

    runner = claude.beta.messages.tool_runner(
        model=MODEL,
        max_tokens=160,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[get_weather],
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        max_iterations=2,
        stream=stream,
        **GREEDY,
    )
    replies = [turn.get_final_message() for turn in runner] if stream else list(runner)
    assert [reply.stop_reason for reply in replies] == ["tool_use", "tool_use"]
    assert len(cities) == 2
    # The second turn's prompt holds the first call and its result.
    assert replies[1].usage.input_tokens > replies[0].usage.input_tokens


def test_a_thread_is_refused_as_anthropics_sdks_expect(claude, server):
    with pytest.raises(anthropic.types.ThreadUnsupportedRequestError) as refused:
        claude.beta.messages.create(model=MODEL, max_tokens=4, messages=STORY, thread={"type": "create"})
    assert refused.value.status_code == 400 and refused.value.error_code == "thread_unsupported_request"
    reply = loopback.post(server.base_url + "/v1/messages", json=message_body(thread={"type": "create"}))
    assert reply.status_code == 400
    assert reply.json()["error"]["type"] == "invalid_request_error"
    assert reply.json()["error"]["details"] == {"error_code": "thread_unsupported_request"}
    # Asking for no thread is no refusal; and other errors carry no details.
    assert loopback.post(server.base_url + "/v1/messages", json=message_body(thread=False)).status_code == 200
    assert (
        "details"
        not in loopback.post(server.base_url + "/v1/messages", json=message_body(max_tokens=0)).json()["error"]
    )


def test_auto_tool_choice_may_call_or_answer(claude):
    reply = claude.messages.create(
        model=MODEL,
        max_tokens=60,
        messages=[{"role": "user", "content": "Weather in Rome?"}],
        tools=[WEATHER_TOOL],
        **GREEDY,
    )
    kinds = {block.type for block in reply.content}
    assert kinds <= {"text", "tool_use"}
    assert (reply.stop_reason == "tool_use") == ("tool_use" in kinds) or reply.stop_reason == "max_tokens"


# ---- counting ---------------------------------------------------------------------------


def test_count_tokens_is_what_the_reply_was_prompted_with(claude):
    cases = [
        {"messages": STORY},
        {"messages": STORY, "system": "You are a poet."},
        {"messages": STORY, "tools": [WEATHER_TOOL, TIME_TOOL]},
        {"messages": STORY + [{"role": "assistant", "content": "A tale."}, {"role": "user", "content": "Another."}]},
    ]
    counts = []
    for case in cases:
        counted = claude.messages.count_tokens(model=MODEL, **case).input_tokens
        reply = claude.messages.create(model=MODEL, max_tokens=1, **case)
        assert counted == reply.usage.input_tokens
        counts.append(counted)
    assert len(set(counts)) == len(counts), counts  # each case changes the prompt


# ---- thinking ---------------------------------------------------------------------------


@pytest.mark.parametrize("thinking", [{"type": "enabled", "budget_tokens": 1024}, {"type": "adaptive"}])
def test_thinking_comes_back_as_thinking_blocks(thinking_server, thinking):
    with sdk(thinking_server) as client:
        plain = client.messages.create(model=MODEL, max_tokens=1100, messages=IS_IT, output_config=BOOLEAN, **GREEDY)
        thought = client.messages.create(
            model=MODEL, max_tokens=1100, messages=IS_IT, output_config=BOOLEAN, thinking=thinking, **GREEDY
        )
        off = client.messages.create(
            model=MODEL, max_tokens=1100, messages=IS_IT, output_config=BOOLEAN, thinking={"type": "disabled"}, **GREEDY
        )
    # The template opened <think> and the reply never closes it: all of it is thinking.
    assert [block.type for block in thought.content] == ["thinking"]
    assert thought.content[0].thinking in ("true", "false")
    for reply in (plain, off):
        assert [block.type for block in reply.content] == ["text"]
        assert reply.content[0].text in ("true", "false")
    assert thought.usage.input_tokens > off.usage.input_tokens == plain.usage.input_tokens

    streamed = walk(
        raw_stream(thinking_server, message_body(IS_IT, max_tokens=1100, output_config=BOOLEAN, thinking=thinking))
    )
    assert streamed["content"] == thought.model_dump()["content"]


def test_thinking_blocks_passed_back_are_accepted_and_left_out(thinking_server):
    earlier = [
        *IS_IT,
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "The sky scatters blue light.", "signature": ""},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "true"},
            ],
        },
        {"role": "user", "content": "And the grass?"},
    ]
    without = [*earlier[:1], {"role": "assistant", "content": "true"}, earlier[2]]
    with sdk(thinking_server) as client:
        counted = client.messages.count_tokens(model=MODEL, messages=earlier).input_tokens
        assert counted == client.messages.count_tokens(model=MODEL, messages=without).input_tokens
        reply = client.messages.create(model=MODEL, max_tokens=4, messages=earlier, **GREEDY)
    assert reply.usage.input_tokens == counted


# ---- errors -----------------------------------------------------------------------------


def error_of(reply: httpx.Response, status: int, kind: str) -> str:
    assert reply.status_code == status, reply.text
    body = reply.json()
    assert set(body) == {"type", "error"} and body["type"] == "error", body
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == kind, body
    return body["error"]["message"]


BAD_BODIES = [
    ({"max_tokens": None}, "max_tokens"),
    ({"unknown_field": 1}, "unknown_field"),
    (
        {
            "messages": [
                {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x/a.png"}}]}
            ]
        },
        "messages[0].content[0]",
    ),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "messages[0].content[0]"),
    ({"tool_choice": {"type": "tool", "name": "nowhere"}, "tools": [WEATHER_TOOL]}, "tool_choice.name"),
    ({"thinking": {"type": "enabled", "budget_tokens": 100}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 2048}, "max_tokens": 100}, "thinking.budget_tokens"),
    ({"temperature": 1.5}, "temperature"),
    ({"stop_sequences": ["x"] * 40}, "stop_sequences"),
    ({"output_config": {"format": {"type": "json_schema", "schema": {"type": "nonsense"}}}}, "output_config.format"),
    ({"tools": [{**WEATHER_TOOL, "input_schema": {"type": 3}}]}, "tools[0].input_schema"),
    ({"max_tokens": 10**6}, "max_tokens"),
]


@pytest.mark.parametrize("fields, named", BAD_BODIES, ids=[named for _, named in BAD_BODIES])
def test_bad_requests_are_400s_naming_the_field(server, fields, named):
    body = {k: v for k, v in message_body(**fields).items() if v is not None}
    message = error_of(
        loopback.post(server.base_url + "/v1/messages", json=body, timeout=60), 400, "invalid_request_error"
    )
    assert named in message, message


def test_fields_that_change_nothing_here_are_accepted(server):
    ignored = {
        "service_tier": "auto",
        "speed": "standard",
        "cache_control": {"type": "ephemeral"},
        "container": None,
        "inference_geo": "us",
        "diagnostics": {},
        "mcp_servers": [],
        "output_config": {"effort": "high"},
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
    }
    reply = loopback.post(server.base_url + "/v1/messages", json=message_body(max_tokens=2, **ignored), timeout=60)
    assert reply.status_code == 200, reply.text


def test_the_sdk_raises_its_own_error_classes(claude, server):
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(model=MODEL, max_tokens=4, messages=STORY, extra_body={"nonsense": True})
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError) as missing:
        claude.messages.create(model="no-such-model", max_tokens=4, messages=STORY)
    assert missing.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.count_tokens(model="no-such-model", messages=STORY)
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.count_tokens(model=MODEL, messages=[])


def test_a_body_beyond_the_size_limit_is_413(server):
    body = message_body([{"role": "user", "content": "x" * (33 * 1024 * 1024)}])
    with sdk(server) as client, pytest.raises(anthropic.ContentTooLargeError) as big:
        client.messages.create(**{k: v for k, v in body.items() if k != "temperature"})
    assert big.value.body["error"]["type"] == "request_too_large"


def test_keys_are_taken_from_x_api_key_or_bearer(messages_limited_server):
    with sdk(messages_limited_server, key="wrong") as client, pytest.raises(anthropic.AuthenticationError) as refused:
        client.messages.create(model=MODEL, max_tokens=2, messages=STORY)
    assert refused.value.body["error"]["type"] == "authentication_error"
    with sdk(messages_limited_server, key=KEY) as client:  # x-api-key
        assert client.messages.create(model=MODEL, max_tokens=2, messages=STORY).usage.output_tokens <= 2
    url = messages_limited_server.base_url + "/v1/messages/count_tokens"
    body = {"model": MODEL, "messages": STORY}
    assert loopback.post(url, json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60).status_code == 200
    error_of(loopback.post(url, json=body, timeout=60), 401, "authentication_error")
    # x-api-key is Anthropic's header: the OpenAI routes still want a bearer token.
    chat = loopback.post(
        messages_limited_server.base_url + "/v1/chat/completions",
        headers={"x-api-key": KEY},
        timeout=60,
        json={"model": MODEL, "messages": STORY, "max_tokens": 1},
    )
    assert chat.status_code == 401 and "error" in chat.json() and "type" not in chat.json()


async def _hold(http: httpx.AsyncClient, started: trio.Event, scope: trio.CancelScope) -> None:
    """A chat stream that runs until `scope` is cancelled (ignore_eos), taking the one
    running slot."""
    body = {"model": MODEL, "messages": STORY, "max_tokens": 4000, "ignore_eos": True, "stream": True}
    with scope:
        async with http.stream("POST", "/v1/chat/completions", json=body) as reply:
            assert reply.status_code == 200
            async for _ in reply.aiter_bytes():
                started.set()


@dataclass
class Holder:
    """A client of the server whose one running slot a held chat stream takes: the fake
    engine, how many requests it had been given before the holder, its held steps, and
    the holder's scope (cancelled, the holder leaves)."""

    http: httpx.AsyncClient
    engine: Any
    added: int
    steps: Any
    scope: trio.CancelScope


@contextlib.asynccontextmanager
async def slot_taken(server: Any) -> AsyncIterator[Holder]:
    headers = {"x-api-key": KEY, "Authorization": f"Bearer {KEY}"}  # the holder is a chat stream
    async with (
        httpx.AsyncClient(base_url=server.base_url, timeout=120, headers=headers) as http,
        trio.open_nursery() as holders,
    ):
        with held_steps(server, MODEL) as steps:
            engine = server.pipelines[MODEL][-1]
            added = len(engine.handles)
            started, holding = trio.Event(), trio.CancelScope()
            holders.start_soon(_hold, http, started, holding)
            with trio.fail_after(120):
                await started.wait()
            yield Holder(http, engine, added, steps, holding)


async def test_a_queued_stream_pings_and_a_full_queue_is_429(messages_limited_server):
    server = messages_limited_server
    async with slot_taken(server) as holder:
        http, engine, added, steps, holding = holder.http, holder.engine, holder.added, holder.steps, holder.scope
        body = message_body(max_tokens=4, stream=True)
        async with http.stream("POST", "/v1/messages", json=body) as queued:
            assert queued.status_code == 200
            lines = queued.aiter_lines()
            seen: list[str] = []
            with trio.fail_after(60):
                async for line in lines:
                    seen.append(line)
                    if line == "event: ping":
                        break
            names = [line[len("event: ") :] for line in seen if line.startswith("event: ")]
            assert names == ["message_start", "ping"], seen
            assert server.metric("ovtrio_requests_waiting") == 1
            assert server.metric("ovtrio_requests_running") == 1
            assert len(engine.handles) == added + 1  # the queued stream is not in the engine

            # Now the queue is full: the SDK raises RateLimitError, with Retry-After.
            with sdk(server, key=KEY) as client, pytest.raises(anthropic.RateLimitError) as limited:
                client.messages.create(model=MODEL, max_tokens=2, messages=STORY)
            assert limited.value.body["error"]["type"] == "rate_limit_error"
            assert int(limited.value.response.headers["retry-after"]) >= 1
            assert len(engine.handles) == added + 1  # refused before the engine saw it

            holding.cancel()  # room again: the queued stream runs to its end
            steps.release()
            with trio.fail_after(120):
                seen += [line async for line in lines]
    events = [json.loads(line[len("data: ") :]) for line in seen if line.startswith("data: ")]
    message = walk(events)
    assert message["stop_reason"] == "max_tokens" and message["usage"]["output_tokens"] == 4


async def test_a_queued_stream_whose_client_leaves_leaves_the_queue(messages_limited_server):
    """The stream answers 200 before its request is taken: a client that leaves while it
    waits takes it out of the queue, and the running request goes on."""
    server = messages_limited_server
    async with slot_taken(server) as holder:
        http, engine, added, holding = holder.http, holder.engine, holder.added, holder.scope
        async with http.stream("POST", "/v1/messages", json=message_body(max_tokens=4, stream=True)) as queued:
            assert queued.status_code == 200
            with trio.fail_after(60):
                async for line in queued.aiter_lines():
                    if line == "event: message_start":
                        break
            assert server.metric("ovtrio_requests_waiting") == 1
        # The connection is closed: the queue empties while the holder still runs.
        with trio.fail_after(120):
            while server.metric("ovtrio_requests_waiting") != 0:
                await trio.sleep(0.05)
        assert server.metric("ovtrio_requests_running") == 1
        assert len(engine.handles) == added + 1 and not engine.handles[-1].cancelled  # only the holder
        holding.cancel()


# ---- disconnects and metrics ------------------------------------------------------------


def wait_for_metric(server: RunningServer, name: str, value: float, within: float = 30, **labels: str) -> None:
    deadline = time.monotonic() + within
    while (current := server.metric(name, **labels)) != value:
        assert time.monotonic() < deadline, f"{name} is {current}, not {value}"
        time.sleep(0.05)


def test_a_disconnect_frees_the_engine_request(server):
    body = message_body([{"role": "user", "content": "Count from 1 to 1000, one number per line."}], max_tokens=3000)
    aborted = server.metric("vllm:request_success_total", finished_reason="abort")
    with ExitStack() as stack:
        http = stack.enter_context(httpx.Client(base_url=server.base_url, timeout=60))
        reply = stack.enter_context(http.stream("POST", "/v1/messages", json={**body, "stream": True}))
        lines = reply.iter_lines()  # kept: a closed line iterator closes the connection
        deltas = 0
        for line in lines:
            deltas += line == "event: content_block_delta"
            if deltas == 3:
                break
        assert server.metric("ovtrio_requests_running") == 1
        assert server.metric("ovtrio_engine_requests") == 1
    wait_for_metric(server, "ovtrio_requests_running", 0)
    wait_for_metric(server, "ovtrio_engine_requests", 0)
    assert server.metric("vllm:request_success_total", finished_reason="abort") == aborted + 1


def test_the_routes_show_in_request_metrics(server, claude):
    def count(route: str, status: str) -> float:
        try:
            return server.metric("ovtrio_http_responses_total", method="POST", route=route, status=status)
        except KeyError:
            return 0.0

    before = count("/v1/messages", "200"), count("/v1/messages/count_tokens", "200"), count("/v1/messages", "400")
    claude.messages.create(model=MODEL, max_tokens=1, messages=STORY)
    claude.messages.count_tokens(model=MODEL, messages=STORY)
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model=MODEL, max_tokens=1, messages=STORY, extra_body={"bogus": 1})
    after = count("/v1/messages", "200"), count("/v1/messages/count_tokens", "200"), count("/v1/messages", "400")
    assert [a - b for a, b in zip(after, before)] == [1, 1, 1]


def test_routing_errors_under_the_messages_paths_take_anthropics_shape(server):
    # Message batches are not served: the SDK's client.messages.batches raises NotFoundError.
    with sdk(server) as client, pytest.raises(anthropic.NotFoundError):
        client.messages.batches.list()
    error_of(loopback.post(server.base_url + "/v1/messages/batches", json={}, timeout=60), 404, "not_found_error")
    wrong_method = loopback.get(server.base_url + "/v1/messages", timeout=60)
    assert wrong_method.status_code == 405 and wrong_method.json()["type"] == "error"
    # Paths that merely start alike keep OpenAI's shape.
    other = loopback.post(server.base_url + "/v1/messagesx", json={}, timeout=60)
    assert other.status_code == 404 and set(other.json()) == {"error"}
