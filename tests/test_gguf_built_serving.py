"""A real Gemma 3 GGUF file (gemma-3-270m, Q4_K_M) served through the model ovtrio builds
from it: completions and chat, streamed and not, the family's chat template where the file
has none, and its logits against the numpy forward pass of the file's own weights."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest

from conftest import RunningServer, running_server
from gemma3_reference import forward, read_gguf
from gguf_architectures import real_gemma3

NAME = "gemma-3-270m"
EXACT = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}


@pytest.fixture(scope="module")
def gemma_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return real_gemma3(tmp_path_factory.mktemp("real-gemma3"))


@pytest.fixture(scope="module")
def gemma_server(gemma_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(
        tmp_path_factory.mktemp("gemma-server"), "--model", str(gemma_file), "--served-model-name", NAME
    ) as server:
        yield server


def _built_folder(server: RunningServer) -> Path:
    found = re.search(r"cached in (\S+?)\)", server.log_path.read_text())
    assert found, server.log_path.read_text()
    return Path(found[1])


def test_the_log_says_the_file_has_no_template_and_the_familys_is_used(gemma_server: RunningServer) -> None:
    log = gemma_server.log_path.read_text()
    assert "no chat template: using the gemma family's own" in log
    assert "built from GGUF" in log


def test_completions_and_chat_streamed_and_not_say_the_same(gemma_server: RunningServer) -> None:
    client = openai.OpenAI(base_url=gemma_server.v1, api_key="unused")
    unary = client.completions.create(model=NAME, prompt="The capital of France is", max_tokens=12, temperature=0)
    streamed = client.completions.create(
        model=NAME, prompt="The capital of France is", max_tokens=12, temperature=0, stream=True
    )
    assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == unary.choices[0].text
    assert unary.usage is not None and unary.usage.completion_tokens == 12

    messages = [{"role": "user", "content": "Name a colour."}]
    chat = client.chat.completions.create(model=NAME, messages=messages, max_tokens=10, temperature=0)  # type: ignore[arg-type]
    chat_stream = client.chat.completions.create(
        model=NAME,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=10,
        temperature=0,
        stream=True,
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chat_stream if chunk.choices)
    assert text == chat.choices[0].message.content
    # The family's template: BOS, the user's turn and the model's, as Gemma writes them.
    assert chat.usage is not None
    tokenized = client.post(
        "/tokenize",
        body={
            "model": NAME,
            "prompt": "<bos><start_of_turn>user\nName a colour.<end_of_turn>\n<start_of_turn>model\n",
            "add_special_tokens": False,
        },
        cast_to=object,
    )
    assert chat.usage.prompt_tokens == tokenized["count"]  # type: ignore[index]


def test_the_built_model_computes_the_files_logits(gemma_server: RunningServer, gemma_file: Path) -> None:
    import openvino as ov

    folder = _built_folder(gemma_server)
    client = openai.OpenAI(base_url=gemma_server.v1, api_key="unused")
    tokenized = client.post("/tokenize", body={"model": NAME, "prompt": "The capital of France is"}, cast_to=object)
    ids = tokenized["tokens"]  # type: ignore[index]
    assert ids[0] == 2  # BOS, which the file asks for
    compiled = ov.Core().compile_model(folder / "openvino_model.xml", "CPU", EXACT)
    result = compiled.create_infer_request().infer(
        {
            "input_ids": np.array([ids]),
            "attention_mask": np.ones((1, len(ids)), np.int64),
            "position_ids": np.arange(len(ids))[None],
            "beam_idx": np.zeros(1, np.int32),
        }
    )
    got = np.asarray(result[compiled.output("logits")][0])
    metadata, weights = read_gguf(str(gemma_file))
    expected = forward(metadata, weights, ids)
    assert float(np.abs(got - expected).max()) < 1e-3 * float(np.abs(expected).max())
    assert (got.argmax(-1) == expected.argmax(-1)).all()


def test_a_schema_and_a_forced_tool_call_are_written_in_gemmas_pieces(gemma_server: RunningServer) -> None:
    """Gemma's vocabulary is sentencepiece's: a space is "▁" in its pieces and no token
    holds one. A schema whose enum and pattern hold spaces, and a forced call, are
    written to their end and parse (an all-masked step would write padding to max_tokens)."""
    client = openai.OpenAI(base_url=gemma_server.v1, api_key="unused", max_retries=0)
    schema = {
        "type": "object",
        "properties": {
            "city": {"enum": ["New York", "Los Angeles"]},
            # Bounded, so the reply ends within max_tokens whatever the CPU makes the model write.
            "street": {"type": "string", "pattern": "^[A-Za-z]{1,12} [A-Za-z]{1,12}$"},
        },
        "required": ["city", "street"],
        "additionalProperties": False,
    }
    shaped = client.chat.completions.create(
        model=NAME,
        messages=[{"role": "user", "content": "Give a US city and a street in JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema, "strict": True}},
        max_tokens=100,
        temperature=0,
    )
    assert shaped.choices[0].finish_reason == "stop", shaped.choices[0].message.content
    place = json.loads(shaped.choices[0].message.content or "")
    assert place["city"] in ("New York", "Los Angeles")
    assert re.fullmatch(r"[A-Za-z]{1,12} [A-Za-z]{1,12}", place["street"])

    called = client.chat.completions.create(
        model=NAME,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string", "maxLength": 20}},
                        "required": ["city"],
                        "additionalProperties": False,
                    },
                },
            }
        ],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=100,
        temperature=0,
    )
    calls = called.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather", called.choices[0]  # type: ignore[union-attr]
    assert isinstance(json.loads(calls[0].function.arguments)["city"], str)  # type: ignore[union-attr]
