"""The builder's gpt-oss (gptoss.py) against an independent numpy forward pass
(gpt_oss_reference.py) on a random-weight GGUF file in llama.cpp's layout: MXFP4 experts
kept as f4e2m1 codes and e8m0 scales, attention sinks, sliding-window layers beside full
ones, YaRN, biases everywhere, the router's softmax over its top k and the clamped SwiGLU.
Compared as test_gguf_builder.py compares; the paged pipeline must keep the sinks and the
window when it rewrites the attention."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import RunningServer, running_server
from gguf_architectures import HARMONY_SPECIALS, write_gpt_oss
from gpt_oss_reference import forward, read_gguf
from ovtrio.gguf.builder.folder import write_ir_folder
from test_gguf_builder import _paged_output, _stateful_greedy, _stateful_logits

PROMPT = [*range(40, 260, 6)]  # 37 byte tokens: past the window of 8 many times


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, tuple[dict, dict]]:
    file = write_gpt_oss(tmp_path_factory.mktemp("gpt-oss") / "gpt-oss.gguf")
    folder = tmp_path_factory.mktemp("gpt-oss-ir")
    write_ir_folder(file, folder)
    return file, folder, read_gguf(str(file))


def _max_delta(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(got - expected).max())


def _logprob(logits: np.ndarray, token: int) -> float:
    shifted = logits - logits.max()
    return float(shifted[token] - np.log(np.exp(shifted).sum()))


def test_the_graph_gives_the_reference_logits(gpt_oss: tuple[Path, Path, tuple[dict, dict]]) -> None:
    _, folder, (metadata, weights) = gpt_oss
    expected = forward(metadata, weights, PROMPT)
    got = _stateful_logits(folder, PROMPT)
    difference = _max_delta(got, expected)
    assert difference < 1e-4 * float(np.abs(expected).max()) + 1e-5, difference
    # Each of the family's own parts is far from rounding: the reference without it is far off.
    for part in ("sinks", "clamp", "window"):
        assert _max_delta(forward(metadata, weights, PROMPT, **{part: False}), expected) > 100 * difference, part
    # YaRN's correction range as transformers leaves it for gpt-oss, not rounded as llama.cpp rounds it.
    assert _max_delta(forward(metadata, weights, PROMPT, truncate=True), expected) > 100 * difference


def test_the_experts_stay_mxfp4_in_the_graph(gpt_oss: tuple[Path, Path, tuple[dict, dict]]) -> None:
    import openvino as ov

    _, folder, _ = gpt_oss
    model = ov.Core().read_model(folder / "openvino_model.xml")
    types = {op.get_output_element_type(0) for op in model.get_ops() if op.get_type_name() == "Constant"}
    assert {ov.Type.f4e2m1, ov.Type.f8e8m0} <= types


def test_the_paged_pipeline_keeps_the_sinks_and_gives_the_graphs_greedy_tokens(
    gpt_oss: tuple[Path, Path, tuple[dict, dict]],
) -> None:
    """Prefill sliced into 16-token steps, then decoding one token a step: the paged
    attention SDPAToPagedAttention makes of each layer's attention keeps its sinks and the
    even layers' window (each step's logprob is the reference's, far from the reference's
    without either)."""
    _, folder, (metadata, weights) = gpt_oss
    output = _paged_output(folder, PROMPT, 12)
    tokens = list(output.generated_ids)
    assert tokens == _stateful_greedy(folder, PROMPT, 12)
    # Every step's logprob, the decoding steps' too (one token a step over the paged cache),
    # is the reference's over the prompt and the tokens before it.
    engine = np.array(output.generated_log_probs, np.float64)
    seen = PROMPT + tokens[:-1]

    def logprobs(logits: np.ndarray) -> np.ndarray:
        rows = logits[len(PROMPT) - 1 :]
        return np.array([_logprob(row, token) for row, token in zip(rows, tokens, strict=True)])

    expected = logprobs(forward(metadata, weights, seen))
    assert np.abs(engine - expected).max() < 1e-3
    for part in ("sinks", "window"):
        without = logprobs(forward(metadata, weights, seen, **{part: False}))
        assert np.abs(engine - expected).max() < np.abs(engine - without).max() / 10, part


def test_the_harmony_fallback_and_its_end_tokens(gpt_oss: tuple[Path, Path, tuple[dict, dict]]) -> None:
    import json

    import openvino_genai

    _, folder, _ = gpt_oss
    tokenizer = openvino_genai.Tokenizer(str(folder))
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert rendered.startswith("<|start|>system<|message|>")
    assert rendered.endswith("<|start|>user<|message|>Hi<|end|><|start|>assistant")

    def encoded(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False).input_ids.data[0].tolist())

    control = {name: encoded(name) for name in HARMONY_SPECIALS}
    assert all(len(ids) == 1 for ids in control.values())  # each control token is one token
    assert encoded("<|start|>Hello<|channel|>") == [*control["<|start|>"], *encoded("Hello"), *control["<|channel|>"]]
    eos = json.loads((folder / "generation_config.json").read_text())["eos_token_id"]
    assert sorted(eos) == sorted([*control["<|return|>"], *control["<|call|>"]])


def test_fused_gate_and_up_experts_give_the_reference_logits(tmp_path: Path) -> None:
    """A file converted with llama.cpp's --fuse-gate-up-exps (each expert's gate rows, then
    its up rows, in one ffn_gate_up_exps) computes what the separate tensors do."""
    fused = write_gpt_oss(tmp_path / "fused.gguf", layers=2, fused_gate_up=True)
    write_ir_folder(fused, tmp_path / "built")
    metadata, weights = read_gguf(str(fused))
    expected = forward(metadata, weights, PROMPT)
    difference = _max_delta(_stateful_logits(tmp_path / "built", PROMPT), expected)
    assert difference < 1e-4 * float(np.abs(expected).max()) + 1e-5, difference
    # Gate and up taken the other way round are far off.
    swapped = dict(weights)
    for layer in range(2):
        for suffix in ("weight", "bias"):
            both = weights[f"blk.{layer}.ffn_gate_up_exps.{suffix}"]
            rows = both.shape[1] // 2
            swapped[f"blk.{layer}.ffn_gate_up_exps.{suffix}"] = np.concatenate([both[:, rows:], both[:, :rows]], 1)
    assert _max_delta(forward(metadata, swapped, PROMPT), expected) > 100 * difference


EXACT_FLAGS = (
    "--inference-precision",
    "f32",
    "--kv-cache-precision",
    "f32",
    "--plugin-config",
    '{"DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}',
)
NAME = "tiny-gpt-oss"


@pytest.fixture(scope="module")
def gpt_oss_server(
    gpt_oss: tuple[Path, Path, tuple[dict, dict]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    file, _, _ = gpt_oss
    with running_server(
        tmp_path_factory.mktemp("gpt-oss-server"), "--model", str(file), "--served-model-name", NAME, *EXACT_FLAGS
    ) as server:
        yield server


def test_ovtrio_serve_serves_the_file_with_its_sinks(
    gpt_oss_server: RunningServer, gpt_oss: tuple[Path, Path, tuple[dict, dict]]
) -> None:
    """`ovtrio serve --model gpt-oss.gguf`: completions and chat, streamed and not, say the
    same; the chat prompt is the harmony fallback's; and the served first token's logprob is
    the reference model's (with its sinks) on the served prompt's own tokens."""
    import openai

    _, _, (metadata, weights) = gpt_oss
    log = gpt_oss_server.log_path.read_text()
    assert "no chat template: using the harmony family's own" in log and "built from GGUF" in log
    client = openai.OpenAI(base_url=gpt_oss_server.v1, api_key="unused", max_retries=0, timeout=600)
    prompt = "Hello the world"
    unary = client.completions.create(model=NAME, prompt=prompt, max_tokens=8, temperature=0, logprobs=1)
    streamed = client.completions.create(model=NAME, prompt=prompt, max_tokens=8, temperature=0, stream=True)
    assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == unary.choices[0].text
    ids = client.post("/tokenize", body={"model": NAME, "prompt": prompt}, cast_to=object)["tokens"]  # type: ignore[index]
    logprobs = unary.choices[0].logprobs
    assert logprobs is not None and logprobs.token_logprobs and logprobs.tokens
    first = client.post(
        "/tokenize", body={"model": NAME, "prompt": logprobs.tokens[0], "add_special_tokens": False}, cast_to=object
    )["tokens"]  # type: ignore[index]
    expected = _logprob(forward(metadata, weights, ids)[-1], first[0])
    assert abs(float(logprobs.token_logprobs[0]) - expected) < 1e-3

    messages: Any = [{"role": "user", "content": "Hello the world"}]
    chat = client.chat.completions.create(model=NAME, messages=messages, max_tokens=8, temperature=0)
    chat_stream = client.chat.completions.create(
        model=NAME, messages=messages, max_tokens=8, temperature=0, stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chat_stream if chunk.choices)
    assert text == (chat.choices[0].message.content or "")
    rendered = "<|start|>user<|message|>Hello the world<|end|><|start|>assistant"
    counted = client.post(
        "/tokenize", body={"model": NAME, "prompt": rendered, "add_special_tokens": False}, cast_to=object
    )["count"]  # type: ignore[index]
    assert chat.usage is not None and chat.usage.prompt_tokens > counted  # the system header before it
