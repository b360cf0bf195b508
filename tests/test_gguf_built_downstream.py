"""Models ovtrio builds from GGUF files (Gemma 2, Qwen3-MoE, Qwen2-MoE, gpt-oss, Ministral 3; random weights in
the families' layouts, tests/gguf_architectures.py) served on demand from a models folder
with everything downstream of the model: chat streamed and not, a forced tool call and a
JSON schema (the grammar built from the rebuilt tokenizer's vocabulary), prompt scoring
against the numpy forward pass of the file's own weights, and a hostile file of a built
architecture failing alone beside three streams on the others.

The server computes in f32 without dynamic quantization, where the scores can be compared
with the reference on any CPU."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

import loopback
from conftest import RunningServer, running_server
from dense_reference import forward as dense_forward
from gemma2_reference import forward as gemma2_forward
from gemma3_reference import read_gguf
from gguf_architectures import write_dense, write_gemma3, write_gpt_oss, write_qwen_moe
from gpt_oss_reference import forward as gpt_oss_forward
from qwen_moe_reference import forward as qwen_moe_forward

EXACT_FLAGS = (
    "--inference-precision",
    "f32",
    "--kv-cache-precision",
    "f32",
    "--plugin-config",
    '{"DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}',
)
BUILT = ("tiny-qwen3moe", "tiny-qwen2moe", "tiny-gemma2", "tiny-gpt-oss", "tiny-mistral3")
PROMPT_IDS = [*range(40, 200, 9)]


def _write_models(models: Path) -> dict[str, Path]:
    models.mkdir()
    files = {
        "tiny-qwen3moe": write_qwen_moe(models / "tiny-qwen3moe.gguf"),
        "tiny-qwen2moe": write_qwen_moe(models / "tiny-qwen2moe.gguf", architecture="qwen2moe"),
        "tiny-gemma2": write_gemma3(models / "tiny-gemma2.gguf", architecture="gemma2"),
        "tiny-gpt-oss": write_gpt_oss(models / "tiny-gpt-oss.gguf"),
        "tiny-mistral3": write_dense(models / "tiny-mistral3.gguf", "mistral3"),
        # More experts used than the file has: refused with the reason, alone.
        "hostile-moe": write_qwen_moe(models / "hostile-moe.gguf", experts_used=99, seed=1),
    }
    return files


@pytest.fixture(scope="module")
def built_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _write_models(tmp_path_factory.mktemp("built-downstream") / "models")


@pytest.fixture(scope="module")
def server(built_files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    folder = next(iter(built_files.values())).parent
    with running_server(
        tmp_path_factory.mktemp("built-downstream-server"), "--models-dir", str(folder), *EXACT_FLAGS
    ) as running:
        yield running


def _client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=600)


@pytest.mark.parametrize("model", BUILT)
def test_chat_streamed_and_not_say_the_same(server: RunningServer, model: str) -> None:
    client = _client(server)
    messages: Any = [{"role": "user", "content": "Hello the world"}]
    unary = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0)
    streamed = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0, stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices)
    assert text == unary.choices[0].message.content
    assert unary.usage is not None and unary.usage.completion_tokens <= 8


# gpt-oss writes on harmony channels, where a forced call is refused (its own test below).
FORCED_CALLS = tuple(model for model in BUILT if model != "tiny-gpt-oss")


@pytest.mark.parametrize("model", FORCED_CALLS)
def test_a_forced_tool_call_and_a_schema_hold_on_a_built_model(server: RunningServer, model: str) -> None:
    client = _client(server)
    tool: Any = {
        "type": "function",
        "function": {
            "name": "paint",
            "parameters": {
                "type": "object",
                "properties": {"colour": {"enum": ["red", "green"]}},
                "required": ["colour"],
                "additionalProperties": False,
            },
        },
    }
    messages: Any = [{"role": "user", "content": "Hello"}]
    called = client.chat.completions.create(
        model=model,
        messages=messages,
        tools=[tool],
        tool_choice={"type": "function", "function": {"name": "paint"}},
        max_tokens=160,
        temperature=0,
    )
    calls = called.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "paint"  # type: ignore[union-attr]
    assert json.loads(calls[0].function.arguments)["colour"] in ("red", "green")  # type: ignore[union-attr]

    schema = {
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    shaped = client.chat.completions.create(
        model=model,
        messages=messages,
        response_format={"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": True}},
        max_tokens=40,
        temperature=0,
    )
    assert json.loads(shaped.choices[0].message.content or "") in ({"answer": "yes"}, {"answer": "no"})
    assert shaped.choices[0].finish_reason == "stop"


def test_gpt_oss_is_refused_a_forced_call_and_holds_auto_tools(server: RunningServer) -> None:
    """A forced call cannot be held to one harmony channel: a 400 naming tool_choice; with
    tool_choice auto the same request is served."""
    tool: Any = {"type": "function", "function": {"name": "paint", "parameters": {"type": "object"}}}
    body = {"model": "tiny-gpt-oss", "messages": [{"role": "user", "content": "Hello"}], "tools": [tool]}
    forced = {**body, "tool_choice": {"type": "function", "function": {"name": "paint"}}, "max_tokens": 8}
    refused = loopback.post(server.base_url + "/v1/chat/completions", json=forced, timeout=600)
    assert refused.status_code == 400, refused.text
    assert "tool_choice" in refused.json()["error"]["message"]
    served = loopback.post(
        server.base_url + "/v1/chat/completions", json={**body, "tool_choice": "auto", "max_tokens": 8}, timeout=600
    )
    assert served.status_code == 200, served.text
    assert served.json()["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")


@pytest.mark.parametrize("model", BUILT)
def test_prompt_scores_are_the_reference_models(
    server: RunningServer, built_files: dict[str, Path], model: str
) -> None:
    reply = loopback.post(
        server.base_url + "/v1/completions",
        json={"model": model, "prompt": PROMPT_IDS, "max_tokens": 1, "prompt_logprobs": 0, "temperature": 0},
        timeout=600,
    )
    assert reply.status_code == 200, reply.text
    entries = reply.json()["choices"][0]["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(PROMPT_IDS)
    metadata, weights = read_gguf(str(built_files[model]))
    if "gemma2" in model:  # the attention scores uncapped, as the served model computes them (docs/models.md)
        logits = gemma2_forward(metadata, weights, PROMPT_IDS, attention_softcap=False).astype(np.float64)
    elif "gpt-oss" in model:
        logits = gpt_oss_forward(metadata, weights, PROMPT_IDS).astype(np.float64)
    elif "mistral3" in model:
        logits = dense_forward(metadata, weights, PROMPT_IDS).astype(np.float64)
    else:
        logits = qwen_moe_forward(metadata, weights, PROMPT_IDS).astype(np.float64)
    log_softmax = logits - logits.max(-1, keepdims=True)
    log_softmax -= np.log(np.exp(log_softmax).sum(-1, keepdims=True))
    for position in range(1, len(PROMPT_IDS)):
        token = PROMPT_IDS[position]
        got = entries[position][str(token)]["logprob"]
        assert abs(got - log_softmax[position - 1, token]) < 1e-3, (position, got, log_softmax[position - 1, token])


def test_a_hostile_file_of_a_built_architecture_fails_alone(server: RunningServer) -> None:
    """Three streams on built models run while the hostile file is asked for: it is refused
    with the reason, and every stream ends whole."""
    results: list[Any] = []

    def stream(model: str) -> None:
        chunks = _client(server).chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=24,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        finish = [
            chunk.choices[0].finish_reason for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason
        ]
        results.append((model, finish))

    threads = [threading.Thread(target=stream, args=(model,)) for model in BUILT]
    for thread in threads:
        thread.start()
    refused = loopback.post(
        server.base_url + "/v1/chat/completions",
        json={"model": "hostile-moe", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
        timeout=600,
    )
    for thread in threads:
        thread.join()
    assert refused.status_code == 503, refused.text
    message = refused.json()["error"]["message"]
    assert "expert_used_count 99" in message and "\n" not in message
    assert sorted(results) == sorted((model, ["length"]) for model in BUILT)
    assert loopback.get(server.base_url + "/health", timeout=30).status_code == 200
