"""The builder's mixture-of-experts architectures (qwen3moe.py, qwen2moe.py, experts.py)
against an independent numpy forward pass (qwen_moe_reference.py) that picks each token's
experts one token at a time, on random-weight GGUF files in llama.cpp's layout (stacked
experts' tensors; Qwen3-MoE's own head size and head norms; Qwen2-MoE's biases and shared
expert). Compared as test_gguf_builder.py compares."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gguf_architectures import write_qwen_moe
from ovtrio.gguf.builder.folder import write_ir_folder
from qwen_moe_reference import forward, read_gguf
from test_gguf_builder import _stateful_logits, assert_paged_greedy_is_the_graphs

PROMPT = [*range(40, 260, 6)]  # 37 byte tokens


@pytest.fixture(scope="module", params=["qwen3moe", "qwen2moe"])
def moe(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple[dict, dict]]:
    file = write_qwen_moe(tmp_path_factory.mktemp(request.param) / f"{request.param}.gguf", architecture=request.param)
    folder = tmp_path_factory.mktemp(f"{request.param}-ir")
    write_ir_folder(file, folder)
    return folder, read_gguf(str(file))


def _max_delta(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(got - expected).max())


def test_the_graph_gives_the_reference_logits(moe: tuple[Path, tuple[dict, dict]]) -> None:
    folder, (metadata, weights) = moe
    expected = forward(metadata, weights, PROMPT)
    got = _stateful_logits(folder, PROMPT)
    difference = _max_delta(got, expected)
    assert difference < 1e-4 * float(np.abs(expected).max()) + 1e-5, difference
    # Which experts a token goes through matters: two of them instead of four is far off.
    assert _max_delta(forward(metadata, weights, PROMPT, chosen=2), expected) > 100 * difference


def test_the_paged_pipeline_gives_the_graphs_greedy_tokens(moe: tuple[Path, tuple[dict, dict]]) -> None:
    """Prefill sliced into 16-token steps, then decoding one token a step: the experts are
    chosen per token whatever the batch holds."""
    folder, (metadata, weights) = moe
    assert_paged_greedy_is_the_graphs(folder, PROMPT, forward(metadata, weights, PROMPT)[-1])


def test_the_byte_level_tokenizer_round_trips_and_chatml_is_the_fallback(moe: tuple[Path, tuple[dict, dict]]) -> None:
    import json

    import openvino_genai

    folder, _ = moe
    tokenizer = openvino_genai.Tokenizer(str(folder))
    for text in ("Hello the world", "ÄÖ ☃ 日本\n\n  spaces"):
        ids = tokenizer.encode(text, add_special_tokens=False).input_ids.data[0].tolist()
        assert tokenizer.decode(ids) == text
    merged = tokenizer.encode("Hello", add_special_tokens=False).input_ids.data[0].tolist()
    assert len(merged) == 1  # the merges are the file's
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    end = tokenizer.encode("<|im_end|>", add_special_tokens=False).input_ids.data[0].tolist()
    assert len(end) == 1
    eos = json.loads((folder / "generation_config.json").read_text())["eos_token_id"]
    assert end[0] == (eos if isinstance(eos, int) else eos[0])
