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


# "€" is three UTF-8 bytes, here split over two tokens; token 9 is a skipped special
# token (the end of sequence): it adds no bytes.
EURO_TOKENS = {1: b"\xe2\x82", 2: b"\xac", 3: b" ok", 9: b""}


@pytest.mark.parametrize("split", [[4], [1, 3], [1, 1, 1, 1], [2, 2]])
def test_logprob_entries_join_to_the_text_however_the_tokens_arrive(split):
    """Each entry's token is the text that token added: a token that ends inside a
    character adds none, the one that completes it adds the character."""
    from ovtrio.api.chat.writer import ChatWriter
    from ovtrio.api.chunks import Envelope
    from ovtrio.api.completions.writer import CompletionWriter
    from ovtrio.output import Outcome, ResultCollector
    from ovtrio.scheduler import Delta

    ids, logprobs, text = [1, 2, 3, 9], [-0.1, -0.2, -0.3, -0.4], "€ ok"
    outcome = ResultCollector(1).add(
        OutputStage(logprobs=EURO_TOKENS.__getitem__).feed([Delta(0, text, ids, "stop", logprobs), Completed(1, 4)])
    )
    assert isinstance(outcome, Outcome)
    unary = ChatWriter(Envelope("chatcmpl-x", "m", "fp"), logprobs=True).completion(outcome)
    entries = unary["choices"][0]["logprobs"]["content"]
    assert [entry["token"] for entry in entries] == ["", "€", " ok", ""]
    assert b"".join(bytes(entry["bytes"]) for entry in entries) == text.encode()
    validate(unary, "CreateChatCompletionResponse")

    chat_stage, completion_stage = (
        OutputStage(logprobs=EURO_TOKENS.__getitem__),
        OutputStage(logprobs=EURO_TOKENS.__getitem__),
    )
    chat = ChatWriter(Envelope("chatcmpl-x", "m", "fp"), logprobs=True)
    completion = CompletionWriter(Envelope("cmpl-x", "m", "fp"), choices=1, logprobs=True)
    chat_entries, completion_tokens, at = [], [], 0
    for size in split:
        # (the entries come from the ids alone; the delta's text does not matter here)
        delta = [Delta(0, "", ids[at : at + size], None, logprobs[at : at + size])]
        for chunk in chat.write(chat_stage.feed(delta)):
            chat_entries += chunk["choices"][0]["logprobs"]["content"]
        for chunk in completion.write(completion_stage.feed(delta)):
            completion_tokens += chunk["choices"][0]["logprobs"]["tokens"]
        at += size
    assert chat_entries == entries
    assert completion_tokens == ["", "€", " ok", ""]
