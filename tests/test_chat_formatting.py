"""Pure logic of shaping a chat choice into OpenAI objects: tool calls found by a parser
(tool_choice "auto") stream in OpenAI's delta format and add up to the unary message."""

from __future__ import annotations

import random

import pytest

from chat_output import streamed_chat, unary_chat
from openai_schema import validate
from ovtrio.output import OutputStage
from ovtrio.parsing import HermesToolParser
from ovtrio.scheduler import Completed

TEXT = (
    "Let me check both.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "note": "say \\"hi\\" {ok}"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": [2, 3]}}\n</tool_call>'
)


def stage() -> OutputStage:
    return OutputStage(tool_parser=HermesToolParser)


def streamed(text: str, rng: random.Random) -> list[dict]:
    return streamed_chat(stage, text, rng, 7)


@pytest.mark.parametrize("seed", range(8))
def test_streamed_tool_calls_add_up_to_the_unary_message(seed):
    unary = unary_chat(stage, TEXT, Completed(10, 20))
    validate(unary, "CreateChatCompletionResponse")
    message = unary["choices"][0]["message"]
    assert unary["choices"][0]["finish_reason"] == "tool_calls"
    assert message["content"] == "Let me check both.\n"
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather", "add"]

    chunks = streamed(TEXT, random.Random(seed))
    content, calls = "", {}
    for chunk in chunks:
        validate(chunk, "CreateChatCompletionStreamResponse")
        delta = chunk["choices"][0]["delta"]
        content += delta.get("content") or ""
        for call in delta.get("tool_calls") or []:
            entry = calls.setdefault(call["index"], {"name": None, "arguments": ""})
            if "id" in call:
                entry["name"] = call["function"]["name"]
            entry["arguments"] += call["function"]["arguments"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert content == message["content"]
    assert [calls[i]["name"] for i in sorted(calls)] == ["get_weather", "add"]
    # Byte for byte: the streamed fragments, joined, are the unary arguments.
    assert [calls[i]["arguments"] for i in sorted(calls)] == [c["function"]["arguments"] for c in message["tool_calls"]]


def test_plain_text_with_a_parser_stays_content():
    unary = unary_chat(stage, "Just words, no calls.", Completed(1, 2))
    assert unary["choices"][0]["message"]["content"] == "Just words, no calls."
    assert unary["choices"][0]["finish_reason"] == "stop"
    assert "tool_calls" not in unary["choices"][0]["message"]
