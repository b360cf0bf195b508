"""The builder's phi3 architecture (ovtrio/gguf/builder/phi3.py) against an independent
numpy forward pass (phi3_reference.py), on random-weight GGUF files in llama.cpp's phi3
layout: Phi-4-mini's shape (LongRoPE, partial rotary, tied output), Phi-3-mini-4k's
(sliding window, full rotary, own output). Compared as test_gguf_builder.py compares."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gguf_architectures import write_phi3
from ovtrio.gguf.builder.folder import write_ir_folder
from phi3_reference import forward, read_gguf
from test_gguf_builder import _stateful_logits, assert_paged_greedy_is_the_graphs

WINDOW = 8
PROMPT = [1, *range(6, 262, 7)]  # <s> and 37 byte tokens: past the window many times


def _built(tmp_path_factory: pytest.TempPathFactory, name: str, **shape: object) -> tuple[Path, tuple[dict, dict]]:
    file = write_phi3(tmp_path_factory.mktemp(name) / f"{name}.gguf", **shape)  # type: ignore[arg-type]
    folder = tmp_path_factory.mktemp(f"{name}-ir")
    write_ir_folder(file, folder)
    return folder, read_gguf(str(file))


@pytest.fixture(scope="module")
def phi4_mini(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple[dict, dict]]:
    # Phi-4-mini: 24 of 32 dimensions a head rotated, 128k context over 4k original.
    return _built(tmp_path_factory, "phi4-mini", rotary_dim=24, context_length=131072, original_context_length=4096)


@pytest.fixture(scope="module")
def phi3_mini_4k(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple[dict, dict]]:
    return _built(tmp_path_factory, "phi3-mini-4k", window=WINDOW, tied=False)


def _max_delta(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(got - expected).max())


def test_longrope_and_partial_rotary_give_the_reference_logits(phi4_mini: tuple[Path, tuple[dict, dict]]) -> None:
    folder, (metadata, weights) = phi4_mini
    expected = forward(metadata, weights, PROMPT)
    got = _stateful_logits(folder, PROMPT)
    difference = _max_delta(got, expected)
    assert difference < 1e-4 * float(np.abs(expected).max()) + 1e-4, difference
    # The long factors are the ones used: the short ones give other logits.
    assert _max_delta(forward(metadata, weights, PROMPT, factors="short"), expected) > 100 * difference


def test_the_window_and_the_own_output_give_the_reference_logits(
    phi3_mini_4k: tuple[Path, tuple[dict, dict]],
) -> None:
    folder, (metadata, weights) = phi3_mini_4k
    assert "output.weight" in weights
    expected = forward(metadata, weights, PROMPT)
    got = _stateful_logits(folder, PROMPT)
    difference = _max_delta(got, expected)
    assert difference < 1e-4 * float(np.abs(expected).max()) + 1e-4, difference
    assert _max_delta(forward(metadata, weights, PROMPT, window=False), expected) > 100 * difference


@pytest.mark.parametrize("model", ["phi4_mini", "phi3_mini_4k"])
def test_the_paged_pipeline_gives_the_graphs_greedy_tokens(model: str, request: pytest.FixtureRequest) -> None:
    """The continuous-batching pipeline's paged attention keeps the rope and the window, in
    a prefill sliced smaller than the prompt."""
    folder, (metadata, weights) = request.getfixturevalue(model)
    assert_paged_greedy_is_the_graphs(folder, PROMPT, forward(metadata, weights, PROMPT)[-1])


def test_phis_template_and_end_of_turn(phi3_mini_4k: tuple[Path, tuple[dict, dict]]) -> None:
    import json

    import openvino_genai

    folder, _ = phi3_mini_4k
    tokenizer = openvino_genai.Tokenizer(str(folder))
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert rendered == "<|user|>\nHi<|end|>\n<|assistant|>\n"
    ids = tokenizer.encode("<|user|>", add_special_tokens=False).input_ids.data[0].tolist()
    assert len(ids) == 1
    eos = json.loads((folder / "generation_config.json").read_text())["eos_token_id"]
    for token in ("<|end|>", "<|endoftext|>"):
        assert tokenizer.encode(token, add_special_tokens=False).input_ids.data[0].tolist()[0] in eos
