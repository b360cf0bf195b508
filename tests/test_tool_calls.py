"""Tool calling on the embedded model: tool_choice "required" and named functions are
enforced by constrained decoding, so even a 135M model emits calls whose arguments
validate against the function's parameters; tool history reaches the chat template."""

from __future__ import annotations

import json

import jsonschema
import pytest

from helpers import chat_body, post
from openai_schema import validate
from server_pool import server_fixture
from sse import stream_post

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
# One nested (OpenAI) and one flat (OVMS) function tool.
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": WEATHER},
    },
    {"type": "function", "name": "add", "description": "Add two integers", "parameters": ADD},
]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def tool_body(tool_choice, **extra) -> dict:
    # Room for the most calls a forced "required" choice may make (formats.MAX_PARALLEL_CALLS),
    # each written compactly: the array then closes within the budget.
    return chat_body(messages=QUESTION, tools=TOOLS, tool_choice=tool_choice, max_tokens=200, **extra)


def assert_valid_calls(calls: list[dict], only: str | None = None) -> None:
    assert calls, "no tool calls"
    ids = [call["id"] for call in calls]
    assert len(set(ids)) == len(ids) and all(i.startswith("call_") for i in ids)
    for call in calls:
        assert call["type"] == "function"
        name = call["function"]["name"]
        assert name in SCHEMAS and (only is None or name == only)
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 3}])
@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_forced_calls_unary(server, tool_choice, sampling):
    reply = post(server.base_url, "/v3/chat/completions", tool_body(tool_choice, **sampling))
    assert reply.status_code == 200, reply.text
    body = reply.json()
    validate(body, "CreateChatCompletionResponse")
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    only = None if tool_choice == "required" else "add"
    assert_valid_calls(choice["message"]["tool_calls"], only)
    if only:
        assert len(choice["message"]["tool_calls"]) == 1


def test_flat_named_tool_choice(server):
    reply = post(
        server.base_url, "/v3/chat/completions", tool_body({"type": "function", "name": "get_weather"}, temperature=0)
    )
    calls = reply.json()["choices"][0]["message"]["tool_calls"]
    assert_valid_calls(calls, "get_weather")


def test_forced_calls_streamed_in_openai_delta_format(server):
    body = tool_body("required", temperature=0)
    unary = post(server.base_url, "/v3/chat/completions", body).json()["choices"][0]["message"]["tool_calls"]
    chunks = stream_post(server.base_url, "/v3/chat/completions", {**body, "stream": True})
    for chunk in chunks:
        validate(chunk, "CreateChatCompletionStreamResponse")
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for delta in chunk["choices"][0]["delta"].get("tool_calls") or []:
            call = calls.setdefault(delta["index"], {"id": None, "name": None, "arguments": ""})
            if "id" in delta:
                assert call["id"] is None, "id and name come once, first"
                call["id"], call["name"] = delta["id"], delta["function"]["name"]
            call["arguments"] += delta["function"].get("arguments", "")
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    streamed = [calls[i] for i in sorted(calls)]
    assert [c["name"] for c in streamed] == [c["function"]["name"] for c in unary]
    assert [c["arguments"] for c in streamed] == [c["function"]["arguments"] for c in unary]
    assert_valid_calls(
        [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in streamed
        ]
    )


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "add"}}, {"type": "function", "name": "get_weather"}],
)
def test_a_streamed_forced_call_opens_with_null_content_as_openais(server, tool_choice):
    """The first chunk of a choice that carries tool calls has "content": null (a client
    reading "" begins a text part before the call); text replies keep "" (OpenAI's)."""
    chunks = stream_post(
        server.base_url, "/v1/chat/completions", {**tool_body(tool_choice, temperature=0), "stream": True}
    )
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks if chunk["choices"]]
    assert all(delta.get("content") is None for delta in deltas), deltas
    assert any(delta.get("tool_calls") for delta in deltas)
    for chunk in chunks:
        validate(chunk, "CreateChatCompletionStreamResponse")
    text = stream_post(server.base_url, "/v1/chat/completions", chat_body(max_tokens=2, stream=True))
    assert text[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}


def test_sdk_reads_forced_calls(client):
    reply = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=QUESTION,
        tools=TOOLS[:1],
        tool_choice="required",
        max_tokens=80,
        temperature=0,
    )
    call = reply.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    assert reply.choices[0].finish_reason == "tool_calls"


def test_parallel_tool_calls_false_makes_one_call(server):
    reply = post(
        server.base_url, "/v3/chat/completions", tool_body("required", temperature=0, parallel_tool_calls=False)
    )
    assert len(reply.json()["choices"][0]["message"]["tool_calls"]) == 1


def test_tool_choice_none_answers_in_text(server):
    body = tool_body("none", temperature=0, ignore_eos=True, logprobs=True) | {"max_tokens": 16}
    choice = post(server.base_url, "/v3/chat/completions", body).json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert "tool_calls" not in choice["message"]
    # all 16 tokens are text, none read as a call
    tokens = [entry["token"] for entry in choice["logprobs"]["content"]]
    assert len(tokens) == 16 and "".join(tokens) == choice["message"]["content"]


def test_tool_history_reaches_the_template(server):
    """An assistant tool call and the tool's result are part of the prompt."""
    history = QUESTION + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees and sunny"},
    ]
    short = post(
        server.base_url,
        "/v3/chat/completions",
        chat_body(messages=QUESTION, tools=TOOLS, tool_choice="none", max_tokens=1),
    ).json()
    long = post(
        server.base_url,
        "/v3/chat/completions",
        chat_body(messages=history, tools=TOOLS, tool_choice="none", max_tokens=1),
    ).json()
    assert long["usage"]["prompt_tokens"] > short["usage"]["prompt_tokens"] + 10


BAD = [
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function"}]}, "tools[0]"),
    (
        {
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}],
            "tool_choice": "required",
        },
        "tools[0].function.parameters",
    ),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "missing"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "tools"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0]"),
]


@pytest.mark.parametrize("fields, param", BAD)
def test_bad_tool_requests_are_a_400(server, fields, param):
    body = {**chat_body(messages=QUESTION, max_tokens=4), **fields}
    reply = post(server.base_url, "/v3/chat/completions", body)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


PLAIN_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# A server whose --chat-template knows nothing of tools (and has no default system
# prompt): the engine's template polyfill still shows the tools to the model.
plain_template_server = server_fixture(
    "plain_template_server", "--chat-template", "{template.jinja}", files={"template.jinja": PLAIN_TEMPLATE}
)


def test_chat_template_override_is_used(server, plain_template_server):
    body = chat_body(messages=QUESTION, max_tokens=1)
    own = post(server.base_url, "/v3/chat/completions", body).json()["usage"]["prompt_tokens"]
    plain = post(plain_template_server.base_url, "/v3/chat/completions", body).json()["usage"]["prompt_tokens"]
    assert plain < own  # the model's own template adds a default system prompt


def test_forced_calls_work_without_template_support(plain_template_server):
    short = post(plain_template_server.base_url, "/v3/chat/completions", chat_body(messages=QUESTION, max_tokens=1))
    shown = post(plain_template_server.base_url, "/v3/chat/completions", {**tool_body("auto"), "max_tokens": 1})
    assert shown.json()["usage"]["prompt_tokens"] > short.json()["usage"]["prompt_tokens"] + 20
    reply = post(plain_template_server.base_url, "/v3/chat/completions", tool_body("required", temperature=0))
    assert reply.status_code == 200, reply.text
    assert_valid_calls(reply.json()["choices"][0]["message"]["tool_calls"])
