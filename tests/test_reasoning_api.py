"""Reasoning for <think> models: chat_template_kwargs and reasoning.effort reach the chat
template, and what the model thinks goes to reasoning_content (and `reasoning`), never to
content. Exercised with a --chat-template that opens <think> when enable_thinking is on,
which turns the server's reasoning parser on (the template uses <think>)."""

from __future__ import annotations

import random

import pytest

import loopback
from chat_output import streamed_chat, unary_chat
from helpers import ENDS_BY_ITSELF, chat_body, post
from openai_schema import validate
from ovtrio.output import OutputStage
from ovtrio.parsing import HermesToolParser, ReasoningSplitter
from ovtrio.scheduler import Completed
from server_pool import server_fixture
from sse import stream_post
from vocab import embedded_vocabulary

THINKING_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking %}<think>\n{% endif %}{% endif %}"
)
QUESTION = [{"role": "user", "content": "Why is the sky blue?"}]
# The reply is `true` or `false` and then the end, whatever the model thinks (see
# helpers.ENDS_BY_ITSELF): with thinking on, that reply is all reasoning.
BOOLEAN = ENDS_BY_ITSELF["response_format"]


thinking_server = server_fixture(
    "thinking_server", "--chat-template", "{template.jinja}", files={"template.jinja": THINKING_TEMPLATE}
)


def ask(server, **fields) -> dict:
    reply = post(
        server.base_url, "/v3/chat/completions", chat_body(messages=QUESTION, max_tokens=16, temperature=0, **fields)
    )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    validate(body, "CreateChatCompletionResponse")
    return body


@pytest.mark.parametrize(
    "switch",
    [
        {"chat_template_kwargs": {"enable_thinking": True}},
        {"reasoning": {"effort": "low"}},
        {"reasoning_effort": "high"},
    ],
)
def test_thinking_goes_to_reasoning_content(thinking_server, switch):
    plain = ask(thinking_server, response_format=BOOLEAN)
    thinking = ask(thinking_server, response_format=BOOLEAN, **switch)
    message = thinking["choices"][0]["message"]
    # The template opened <think> and the reply never closes it: all of it is reasoning.
    assert message["reasoning_content"] in ("true", "false")
    assert message["reasoning"] == message["reasoning_content"]
    assert message["content"] == ""
    # Without the switch the template opens nothing and the same kind of reply is content.
    assert "reasoning_content" not in plain["choices"][0]["message"]
    assert plain["choices"][0]["message"]["content"] in ("true", "false")
    assert thinking["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"]


def test_streamed_reasoning_matches_unary(thinking_server):
    fields = {"chat_template_kwargs": {"enable_thinking": True}}
    unary = ask(thinking_server, **fields)["choices"][0]["message"]
    chunks = stream_post(
        thinking_server.base_url,
        "/v3/chat/completions",
        chat_body(messages=QUESTION, max_tokens=16, temperature=0, stream=True, **fields),
    )
    reasoning = content = ""
    for chunk in chunks:
        validate(chunk, "CreateChatCompletionStreamResponse")
        delta = chunk["choices"][0]["delta"]
        reasoning += delta.get("reasoning_content") or ""
        content += delta.get("content") or ""
        assert delta.get("reasoning", delta.get("reasoning_content")) == delta.get("reasoning_content")
    assert reasoning == unary.get("reasoning_content", "")
    assert content == unary["content"]


def test_skip_special_tokens_false_returns_the_raw_text(thinking_server):
    switch = {"chat_template_kwargs": {"enable_thinking": True}, "response_format": BOOLEAN}
    parsed = ask(thinking_server, **switch)["choices"][0]["message"]
    raw = ask(thinking_server, skip_special_tokens=False, **switch)["choices"][0]["message"]
    # no parser touched it: the reasoning is content, and the end token is kept
    assert "reasoning_content" not in raw
    assert raw["content"] == parsed["reasoning_content"] + embedded_vocabulary().eos_text()


TEXT = (
    "<think>\nThe user wants weather; call {get_weather} </thi.\n</think>\n\n"
    'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)


@pytest.mark.parametrize("seed", range(6))
def test_reasoning_then_tool_calls_stream_like_unary(seed):
    def stage() -> OutputStage:
        return OutputStage(tool_parser=HermesToolParser, reasoning=ReasoningSplitter)

    unary = unary_chat(stage, TEXT, Completed(1, 2))
    validate(unary, "CreateChatCompletionResponse")
    message = unary["choices"][0]["message"]
    assert message["reasoning_content"] == "\nThe user wants weather; call {get_weather} </thi.\n"
    assert message["content"] == "Sure."
    assert unary["choices"][0]["finish_reason"] == "tool_calls"

    chunks = streamed_chat(stage, TEXT, random.Random(seed), 5)
    reasoning = "".join(c["choices"][0]["delta"].get("reasoning_content", "") for c in chunks)
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    arguments = "".join(
        call["function"]["arguments"] for c in chunks for call in c["choices"][0]["delta"].get("tool_calls") or []
    )
    for chunk in chunks:
        validate(chunk, "CreateChatCompletionStreamResponse")
    assert (reasoning, content) == (message["reasoning_content"], message["content"])
    assert arguments == message["tool_calls"][0]["function"]["arguments"]


def test_responses_stream_reasoning_events(thinking_server):
    """The Responses API streams thinking as a reasoning item, with its own events."""
    import json

    body = {
        "model": "SmolLM2-135M-Instruct",
        "input": "Is the sky blue?",
        "max_output_tokens": 12,
        "temperature": 0,
        "stream": True,
        "reasoning": {"effort": "low"},
        "text": {"format": {"type": "json_schema", "name": "answer", "schema": {"type": "boolean"}}},
    }
    with loopback.stream("POST", thinking_server.base_url + "/v1/responses", json=body, timeout=60) as reply:
        raw = reply.read().decode()
    events = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]
    for event in events:
        validate(event, "ResponseStreamEvent")
    kinds = [e["type"] for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
    ]
    assert events[2]["item"]["type"] == "reasoning"
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_summary_text.delta")
    done = next(e for e in events if e["type"] == "response.reasoning_summary_text.done")
    assert deltas in ("true", "false") and deltas == done["text"]
    assert "response.reasoning_summary_part.done" in kinds and kinds[-1] == "response.completed"
    final = events[-1]["response"]
    assert final["output"][0]["type"] == "reasoning" and final["output"][0]["summary"][0]["text"] == deltas
    unary = post(thinking_server.base_url, "/v1/responses", {**body, "stream": False}).json()
    validate(unary, "Response")
    assert unary["output"][0]["summary"][0]["text"] == deltas
