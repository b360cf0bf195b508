"""The builder's gpt-oss (gptoss.py) against an independent numpy forward pass
(gpt_oss_reference.py) on a random-weight GGUF file in llama.cpp's layout: MXFP4 experts
kept as f4e2m1 codes and e8m0 scales, attention sinks, sliding-window layers beside full
ones, YaRN, biases everywhere, the router's softmax over its top k and the clamped SwiGLU.
Compared as test_gguf_builder.py compares; the paged pipeline must keep the sinks and the
window when it rewrites the attention."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

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
    attention SDPAToPagedAttention makes of each layer's attention keeps its sinks (its
    first token's logprob is the reference's, not the reference's without sinks) and the
    even layers' window."""
    _, folder, (metadata, weights) = gpt_oss
    output = _paged_output(folder, PROMPT, 12)
    tokens = list(output.generated_ids)
    assert tokens == _stateful_greedy(folder, PROMPT, 12)
    engine = float(output.generated_log_probs[0])
    expected = _logprob(forward(metadata, weights, PROMPT)[-1], tokens[0])
    assert abs(engine - expected) < 1e-3
    for part in ("sinks", "window"):
        without = _logprob(forward(metadata, weights, PROMPT, **{part: False})[-1], tokens[0])
        assert abs(engine - expected) < abs(engine - without) / 10, part


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
