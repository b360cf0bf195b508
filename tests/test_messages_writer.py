"""The Messages writer and error shapes on their own (no engine): output events in any
order a reply can produce them become Anthropic's events in order, adding up to the
unary message; stop sequences are cut off wherever the text splits; failures and
refusals take Anthropic's error types and status codes."""

from __future__ import annotations

import random

import pytest
from pydantic_core import to_jsonable_python

from messages_stream import walk
from ovtrio.api.errors import APIError, api_error
from ovtrio.api.messages.errors import error_event, status_of
from ovtrio.api.messages.writer import MessageWriter
from ovtrio.output import (
    ChoiceFinished,
    ReasoningDelta,
    TextDelta,
    ToolCallArguments,
    ToolCallDone,
    ToolCallStarted,
)
from ovtrio.scheduler import Completed, Failed, Overloaded


def pieces(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 6))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def run(events: list, batch: int = 1) -> tuple[list[dict], dict]:
    writer = MessageWriter("msg_test", "model", 7)
    written = writer.opening()
    for at in range(0, len(events), batch):
        written += writer.write(events[at : at + batch])
    return to_jsonable_python(written), to_jsonable_python(writer.message)


@pytest.mark.parametrize("seed", range(8))
def test_thinking_text_and_calls_add_up_to_the_message(seed):
    rng = random.Random(seed)
    arguments = '{"city": "Paris", "days": [1, 2]}'
    events = [ReasoningDelta(0, p) for p in pieces("Let me think about it.", rng)]
    events += [TextDelta(0, p) for p in pieces("Calling the tool now.", rng)]
    events.append(ToolCallStarted(0, 0, "call_abc", "get_weather"))
    events += [ToolCallArguments(0, 0, p) for p in pieces(arguments, rng)]
    events += [
        ToolCallDone(0, 0, "call_abc", "get_weather", arguments),
        ChoiceFinished(0, "tool_calls"),
        Completed(7, 30),
    ]
    written, message = run(events, batch=rng.randint(1, 4))
    streamed = walk(written)
    assert streamed == message
    assert message["content"] == [
        {"type": "thinking", "thinking": "Let me think about it.", "signature": ""},
        {"type": "text", "text": "Calling the tool now."},
        {"type": "tool_use", "id": "toolu_abc", "name": "get_weather", "input": {"city": "Paris", "days": [1, 2]}},
    ]
    assert message["stop_reason"] == "tool_use" and message["usage"]["output_tokens"] == 30


@pytest.mark.parametrize("seed", range(8))
def test_the_stop_sequence_that_ended_the_reply_is_named(seed):
    rng = random.Random(seed)
    text = "The keeper climbed the stairs."  # the scheduler has cut " THE END" off
    ending = [ChoiceFinished(0, "stop", " THE END"), Completed(7, 9)]
    written, message = run([TextDelta(0, p) for p in pieces(text, rng)] + ending, batch=rng.randint(1, 3))
    assert walk(written) == message
    assert message["content"] == [{"type": "text", "text": text}]
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", " THE END")
    # Text ended by the model itself, or cut by max_tokens, names none and keeps every character.
    for reason, stop_reason in (("length", "max_tokens"), ("stop", "end_turn")):
        _, message = run([TextDelta(0, text + " THE END"), ChoiceFinished(0, reason), Completed(7, 9)])
        assert message["content"][0]["text"] == text + " THE END"
        assert (message["stop_reason"], message["stop_sequence"]) == (stop_reason, None)


def test_a_failure_after_the_stream_began_is_an_error_event():
    written, _ = run([TextDelta(0, "Hello"), Failed("the engine failed", "engine_error")])
    assert written[-1] == {"type": "error", "error": {"type": "api_error", "message": "the engine failed"}}
    written, _ = run([Failed("KV cache full", "out_of_memory")])
    assert written[-1]["error"]["type"] == "overloaded_error"


@pytest.mark.parametrize(
    "error, status, kind",
    [
        (APIError(400, "bad"), 400, "invalid_request_error"),
        (APIError(401, "who"), 401, "authentication_error"),
        (APIError(404, "none"), 404, "not_found_error"),
        (APIError(413, "big"), 413, "request_too_large"),
        (api_error(Overloaded("full", 2)), 429, "rate_limit_error"),
        (APIError(500, "oops"), 500, "api_error"),
        (APIError(503, "loading"), 529, "overloaded_error"),
        (APIError(504, "slow"), 500, "api_error"),
    ],
)
def test_errors_take_anthropics_types_and_status_codes(error, status, kind):
    assert status_of(error) == status
    assert to_jsonable_python(error_event(error)) == {
        "type": "error",
        "error": {"type": kind, "message": error.message},
    }


def test_disable_parallel_tool_use_keeps_the_first_call():
    calls = []
    for call, name in enumerate(("first", "second")):
        calls += [
            ToolCallStarted(0, call, f"call_{call}", name),
            ToolCallArguments(0, call, "{}"),
            ToolCallDone(0, call, f"call_{call}", name, "{}"),
        ]
    events = calls + [ChoiceFinished(0, "tool_calls"), Completed(7, 9)]
    writer = MessageWriter("msg_test", "model", 7, one_call=True)
    written = to_jsonable_python(writer.opening() + writer.write(events))
    message = to_jsonable_python(writer.message)
    assert walk(written) == message
    assert [block["name"] for block in message["content"]] == ["first"]
    assert message["stop_reason"] == "tool_use"
    _, both = run(events)
    assert [block["name"] for block in both["content"]] == ["first", "second"]
