"""The Responses API's output layout on its own (no engine): output events in any order
a reply can produce them become output items and `response.*` events that validate,
whose deltas add up to their done events and to the final Response; log-probabilities
that come without text are placed by one rule; a stored response's conversation comes
from the typed outcome."""

from __future__ import annotations

import random
from functools import partial

import pytest
from pydantic_core import to_jsonable_python

from openai_schema import validate
from ovtrio.api.responses.body import response_envelope
from ovtrio.api.responses.events import ResponseEvents
from ovtrio.api.responses.protocol import ResponsesRequest
from ovtrio.api.responses.running import answer
from ovtrio.output import (
    ChoiceFinished,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallArguments,
    ToolCallDone,
    ToolCallStarted,
)
from ovtrio.scheduler import Completed

MODEL = "model"


def envelope():
    body = ResponsesRequest.model_validate({"model": MODEL, "input": "x"})
    return partial(response_envelope, body, "resp_test", 0, MODEL)


def logprob(text: str, value: float = -0.5) -> TokenLogprob:
    return TokenLogprob(text.encode(), value, text, 7)


def run(events: list, choices: int = 1, batch: int = 1) -> tuple[list[dict], dict]:
    writer = ResponseEvents(envelope(), choices)
    written = writer.opening()
    for at in range(0, len(events), batch):
        written += writer.write(events[at : at + batch])
    written = to_jsonable_python(written)
    for event in written:
        validate(event, "ResponseStreamEvent")
    assert [e["sequence_number"] for e in written] == list(range(len(written)))
    final = to_jsonable_python(writer.final)
    validate(final, "Response")
    return written, final


def added_up(events: list[dict]) -> list[dict]:
    """The output items the deltas build, with the done events checked against them."""
    items: dict[int, dict] = {}
    for event in events:
        kind, index = event["type"], event.get("output_index")
        if kind == "response.output_item.added":
            items[index] = {**event["item"], "text": "", "logprobs": []}
        elif kind in ("response.output_text.delta", "response.reasoning_summary_text.delta"):
            items[index]["text"] += event["delta"]
            items[index]["logprobs"] += event.get("logprobs", [])
        elif kind == "response.function_call_arguments.delta":
            items[index]["arguments"] += event["delta"]
        elif kind == "response.output_item.done":
            item, built = event["item"], items[index]
            if item["type"] == "message":
                assert item["content"][0]["text"] == built["text"]
                assert item["content"][0]["logprobs"] == built["logprobs"]
            elif item["type"] == "reasoning":
                assert item["summary"][0]["text"] == built["text"]
            else:
                assert item["arguments"] == built["arguments"]
            items[index] = item
    return [items[i] for i in sorted(items)]


def pieces(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 5))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


@pytest.mark.parametrize("seed", range(6))
def test_reasoning_text_and_a_call_add_up_to_the_response(seed):
    rng = random.Random(seed)
    arguments = '{"city": "Paris"}'
    events: list = [ReasoningDelta(0, p) for p in pieces("Let me think.", rng)]
    events.append(TextDelta(0, "", [logprob("<think>"), logprob("</think>")]))  # reasoning's tokens
    events += [TextDelta(0, p, [logprob(p)]) for p in pieces("Calling it now.", rng)]
    events.append(TextDelta(0, "", [logprob("<tool_call>")]))  # the call's first token, before it is parsed
    events.append(ToolCallStarted(0, 0, "call_1", "get_weather"))
    events += [ToolCallArguments(0, 0, p) for p in pieces(arguments, rng)]
    events.append(TextDelta(0, "", [logprob("}")]))  # after the message item: no output text
    events += [ToolCallDone(0, 0, "call_1", "get_weather", arguments), ChoiceFinished(0, "tool_calls"), Completed(3, 9)]
    written, final = run(events, batch=rng.randint(1, 4))
    assert added_up(written) == final["output"]
    assert [item["type"] for item in final["output"]] == ["reasoning", "message", "function_call"]
    message = final["output"][1]["content"][0]
    assert message["text"] == "Calling it now."
    tokens = [entry["token"] for entry in message["logprobs"]]
    assert tokens[:2] == ["<think>", "</think>"] and tokens[-1] == "<tool_call>"
    assert "".join(tokens[2:-1]) == message["text"]
    assert final["output"][2]["arguments"] == arguments and final["status"] == "completed"


def test_a_token_with_no_text_keeps_its_logprob_in_the_open_message():
    """The end-of-text token adds no text: it still has its entry, streamed as an
    output_text.delta with empty text, as in the unary body."""
    events = [
        TextDelta(0, "Hi", [logprob("Hi")]),
        TextDelta(0, "", [logprob("", -0.1)]),
        ChoiceFinished(0, "stop"),
        Completed(3, 2),
    ]
    written, final = run(events)
    deltas = [e for e in written if e["type"] == "response.output_text.delta"]
    assert [(e["delta"], len(e["logprobs"])) for e in deltas] == [("Hi", 1), ("", 1)]
    assert [entry["logprob"] for entry in final["output"][0]["content"][0]["logprobs"]] == [-0.5, -0.1]


def test_a_reply_with_nothing_to_show_is_an_empty_message():
    written, final = run([TextDelta(0, "", [logprob("")]), ChoiceFinished(0, "stop"), Completed(3, 1)])
    assert [item["type"] for item in final["output"]] == ["message"]
    assert final["output"][0]["content"][0]["text"] == "" and len(final["output"][0]["content"][0]["logprobs"]) == 1
    assert added_up(written) == final["output"]
    # Tool calls alone answer without a message item.
    calls = [
        ToolCallStarted(0, 0, "call_1", "f"),
        ToolCallDone(0, 0, "call_1", "f", "{}"),
        ChoiceFinished(0, "tool_calls"),
    ]
    _, final = run([TextDelta(0, "", [logprob("{")]), *calls, Completed(3, 1)])
    assert [item["type"] for item in final["output"]] == ["function_call"]


def test_a_unary_responses_items_are_its_choices_in_order():
    events = [TextDelta(1, "second"), TextDelta(0, "first"), ChoiceFinished(1, "length"), ChoiceFinished(0, "stop")]
    _, final = run([*events, Completed(3, 4)], choices=2)
    assert [item["content"][0]["text"] for item in final["output"]] == ["first", "second"]
    assert [item["status"] for item in final["output"]] == ["completed", "incomplete"]
    assert final["status"] == "incomplete"


def test_the_stored_conversation_comes_from_the_outcome():
    writer = ResponseEvents(envelope())
    calls = [ToolCallStarted(0, 0, "call_1", "f"), ToolCallDone(0, 0, "call_1", "f", '{"a": 1}')]
    writer.write([TextDelta(0, "Let me look."), *calls, ChoiceFinished(0, "tool_calls"), Completed(3, 5)])
    assert writer.outcome is not None
    turns = [turn.model_dump(exclude_none=True) for turn in answer(writer.outcome)]
    assert turns == [
        {"role": "assistant", "content": "Let me look."},
        {
            "role": "assistant",
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
        },
    ]
