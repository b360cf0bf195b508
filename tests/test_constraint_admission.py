"""Output constraints are compiled before admission (ovtrio/constraints/check.py): one
XGrammar cannot build, or builds too slowly or too large, is the sender's 400 naming
the field it came from, on every route, while three unrelated streams run on to their
end. Before, such a schema reached the engine, whose step threw: every request in that
step failed with a 500 carrying the engine's build paths. And a forced tool call whose
parameters hold `$defs`/`$ref` (every nested pydantic model) is served, its arguments
valid against those parameters. Against a real server, but for the compile budget's
refusals, sent to an in-process server (tests/in_process.py) whose fake engine holds the
three streams meanwhile."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest

from held_steps import held_steps
from helpers import MODEL, chat_body, loopback, post
from in_process import in_process_server
from sse import check_chat_choices, stream_post

# What XGrammar refuses, or builds into a grammar of megabytes.
HOSTILE = {
    "empty enum": {"enum": []},
    "integer range of 1e30": {"type": "integer", "minimum": -1e30, "maximum": 1e30},
    "lookbehind": {"type": "string", "pattern": "(?<=a)b"},
    "nested repetition": {"type": "string", "pattern": "^((a{100}){100}){100}$"},
}
# About a second to compile on the worker's sample of the vocabulary on a 2-core EPYC,
# forty times the limit below. (A counted string, `maxLength: 1e9`, was slow until the
# grammar's strings became JSON characters: now it compiles in milliseconds.)
SLOW = {"type": "string", "pattern": "^[a-z]{0,1000}[0-9]{0,1000}[a-z]{0,1000}$"}

# The compile budget is the HTTP layer's (its checker is XGrammar over the model's real
# vocabulary): in process, over a fake engine held while the refusals are sent.
limited_server = in_process_server("limited_server", "--grammar-compile-seconds", "0.1")


def chat_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}


def responses_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"text": {"format": {"type": "json_schema", "name": "x", "schema": schema}}}


def messages_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"output_config": {"format": {"type": "json_schema", "schema": schema}}}


def chat_tool(parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "record", "parameters": parameters}}


def responses_tool(parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "name": "record", "parameters": parameters}


def messages_tool(parameters: dict[str, Any]) -> dict[str, Any]:
    return {"name": "record", "input_schema": parameters}


def chat(extra: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return "/v1/chat/completions", chat_body("Give me a record.", **{"max_tokens": 40, **extra})


def responses(extra: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return "/v1/responses", {"model": MODEL, "input": "Give me a record.", "max_output_tokens": 40, **extra}


def messages(extra: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    body = {"model": MODEL, "max_tokens": 40, "messages": [{"role": "user", "content": "Give me a record."}]}
    return "/v1/messages", {**body, **extra}


def hostile_requests(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any], str]]:
    """(path, body, the field a 400 names) for `schema` on every route that takes one."""
    wrapped = {"type": "object", "properties": {"x": schema}, "required": ["x"]}
    return [
        (*chat(chat_format(schema)), "response_format"),
        (*responses(responses_format(schema)), "text.format"),
        (*messages(messages_format(schema)), "output_config.format"),
        (*chat({"tools": [chat_tool(wrapped)], "tool_choice": "required"}), "tools"),
        (*chat({"tools": [chat_tool(wrapped)], "tool_choice": {"type": "function", "function": {"name": "record"}}}),)
        + ("tools",),
        (*responses({"tools": [responses_tool(wrapped)], "tool_choice": "required"}), "tools"),
        (*messages({"tools": [messages_tool(wrapped)], "tool_choice": {"type": "any"}}), "tools"),
    ]


class InnocentStreams:
    """Three unrelated streams, each to its `max_tokens`."""

    def __init__(self, server, max_tokens: int) -> None:
        self.results: list[Any] = [None] * 3
        body = chat_body("Tell me a story", max_tokens=max_tokens, ignore_eos=True, temperature=0, stream=True)

        def run(i: int) -> None:
            try:
                self.results[i] = stream_post(server.base_url, "/v1/chat/completions", body, timeout=300)
            except Exception as exc:  # noqa: BLE001 - checked by check()
                self.results[i] = exc

        self.threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
        for thread in self.threads:
            thread.start()
        deadline = time.monotonic() + 300  # a cap for a hang
        while server.metric("ovtrio_requests_running") < 3:  # all three in the engine
            assert time.monotonic() < deadline and all(thread.is_alive() for thread in self.threads), self.results
            time.sleep(0.02)

    def check(self) -> None:
        for thread in self.threads:
            thread.join(300)
        for chunks in self.results:
            assert not isinstance(chunks, Exception), chunks
            assert check_chat_choices(chunks, 1).finish_reasons == ["length"]


# One set of three streams runs while every schema's requests are refused: 300 tokens at
# three sequences last 2.7 times as long as all of them (measured on a 2-core EPYC: 7.7 s
# against 2.8 s, two of which are the nested repetition's three compiles; streams of 200
# tokens beside each schema alone outlasted its requests by 1.7 times at the least, and
# the tests spent most of their time waiting for them to end).
HOSTILE_STREAM_TOKENS = 300
# The slow schema's three compiles are cut at the limit's 0.1 s each, yet its requests
# took up to 3.2 s on a busy 2-core machine, against 3.3 s for 100 tokens: 200.
SLOW_STREAM_TOKENS = 200


def test_constraints_that_do_not_compile_are_a_400_naming_their_field_beside_three_streams(server):
    refused_beside_streams(server, HOSTILE, HOSTILE_STREAM_TOKENS)


def test_a_constraint_that_compiles_past_the_time_limit_is_a_400_beside_three_streams(limited_server, monkeypatch):
    engine = limited_server.pipelines[MODEL][-1]
    added = len(engine.handles)
    with held_steps(limited_server, MODEL) as steps:
        refused_beside_streams(limited_server, {"slow": SLOW}, SLOW_STREAM_TOKENS, release=steps.release)
    assert len(engine.handles) == added + 3  # the three streams, and no refused request
    # What compiles within the limit is served on the same server: its grammar reaches
    # the engine (whose constrained output the real servers' tests check).
    configs: list[Any] = []
    add_request = engine.add_request

    def recorded(request_id: int, prompt: Any, *images_and_config: Any) -> Any:
        configs.append(images_and_config[-1])
        return add_request(request_id, prompt, *images_and_config)

    monkeypatch.setattr(engine, "add_request", recorded)
    reply = post(limited_server.base_url, *chat(chat_format({"type": "boolean"})))
    assert reply.status_code == 200, reply.text
    assert len(configs) == 1 and configs[0].structured_output_config is not None


def refused_beside_streams(
    server, schemas: dict[str, dict[str, Any]], stream_tokens: int, release: Callable[[], None] | None = None
) -> None:
    """Each of `schemas` on every route, streamed and not, refused while three streams of
    `stream_tokens` tokens run, which then end whole (once `release()`d, if given: what
    lets a held engine go on)."""
    streams = InnocentStreams(server, stream_tokens)
    for name, schema in schemas.items():
        for path, body, param in hostile_requests(schema):
            for stream in (False, True):
                reply = post(server.base_url, path, {**body, "stream": stream})
                assert reply.status_code == 400, (name, path, param, reply.text)
                error = reply.json()["error"]
                if path != "/v1/messages":  # Anthropic's error shape has no param
                    assert error["param"] == param, (name, path, error)
                assert "cannot be used for constrained decoding" in error["message"], (name, error)
                assert ".cc" not in error["message"] and "/project" not in error["message"], (name, error)
    if release is not None:
        release()
    streams.check()
    assert loopback.get(server.base_url + "/health/ready").status_code == 200


# A nested pydantic model's schema, as openai.pydantic_function_tool emits it: the
# nested model in `$defs`, referenced by `$ref`.
ITEMS = {
    "$defs": {
        "Item": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 8}, "count": {"type": "integer", "maximum": 9}},
            "required": ["name", "count"],
            "additionalProperties": False,
        }
    },
    "type": "object",
    "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}, "minItems": 1, "maxItems": 2}},
    "required": ["items"],
    "additionalProperties": False,
}


FORCED_WITH_REFS = {
    "chat required": chat({"tools": [chat_tool(ITEMS)], "tool_choice": "required", "max_tokens": 120}),
    "chat named": chat(
        {
            "tools": [chat_tool(ITEMS)],
            "tool_choice": {"type": "function", "function": {"name": "record"}},
            "max_tokens": 120,
        }
    ),
    "responses required": responses(
        {"tools": [responses_tool(ITEMS)], "tool_choice": "required", "max_output_tokens": 120}
    ),
    "messages any": messages({"tools": [messages_tool(ITEMS)], "tool_choice": {"type": "any"}, "max_tokens": 120}),
}


def forced_arguments(path: str, reply: dict[str, Any]) -> Any:
    if path == "/v1/chat/completions":
        return json.loads(reply["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])
    if path == "/v1/responses":
        return json.loads(next(item for item in reply["output"] if item["type"] == "function_call")["arguments"])
    return next(block for block in reply["content"] if block["type"] == "tool_use")["input"]


@pytest.mark.parametrize("case", FORCED_WITH_REFS)
def test_a_forced_call_whose_parameters_use_defs_serves_valid_arguments(server, case):
    path, body = FORCED_WITH_REFS[case]
    for temperature in (0, 1.0):
        reply = post(server.base_url, path, {**body, "temperature": temperature})
        assert reply.status_code == 200, reply.text
        jsonschema.validate(forced_arguments(path, reply.json()), ITEMS)
