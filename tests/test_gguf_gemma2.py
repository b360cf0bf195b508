"""The builder's gemma2 architecture (ovtrio/gguf/builder/gemma2.py) against an
independent numpy forward pass (gemma2_reference.py), on a random-weight GGUF file in
llama.cpp's gemma2 layout (even layers sliding, both soft caps). Compared as
test_gguf_builder.py compares. The attention scores' soft cap is not in the graph (the
engine's paged attention has none): the graph equals the reference without it within
float rounding, and the cap's own effect is measured and bounded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gemma2_reference import forward, read_gguf
from gguf_architectures import write_gemma3
from ovtrio.gguf.builder.folder import write_ir_folder
from test_gguf_builder import _stateful_logits, assert_paged_greedy_is_the_graphs

WINDOW = 8
PROMPT = [2, *range(6, 262, 7)]  # BOS and 37 byte tokens: past the window many times


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple[dict, dict]]:
    file = write_gemma3(tmp_path_factory.mktemp("gemma2") / "tiny-gemma2.gguf", window=WINDOW, architecture="gemma2")
    folder = tmp_path_factory.mktemp("gemma2-ir")
    write_ir_folder(file, folder)
    return folder, read_gguf(str(file))


def _max_delta(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(got - expected).max())


def test_the_graph_gives_the_reference_logits_without_the_attention_cap(gemma2: tuple[Path, tuple[dict, dict]]) -> None:
    folder, (metadata, weights) = gemma2
    uncapped = forward(metadata, weights, PROMPT, attention_softcap=False)
    got = _stateful_logits(folder, PROMPT)
    difference = _max_delta(got, uncapped)
    assert difference < 1e-4 * float(np.abs(uncapped).max()) + 1e-4, difference
    # The window and the final soft cap are in the graph: without either the reference is far.
    assert _max_delta(forward(metadata, weights, PROMPT, window=False, attention_softcap=False), uncapped) > (
        100 * difference
    )
    assert float(np.abs(got).max()) < 30.0  # the final cap bounds every logit
    # What the attention cap would change, on scores of a trained model's scale: small.
    capped = forward(metadata, weights, PROMPT)
    assert _max_delta(capped, uncapped) < 0.05 * float(np.abs(capped).max())


def test_the_paged_pipeline_gives_the_graphs_greedy_tokens(gemma2: tuple[Path, tuple[dict, dict]]) -> None:
    folder, (metadata, weights) = gemma2
    assert_paged_greedy_is_the_graphs(folder, PROMPT, forward(metadata, weights, PROMPT, attention_softcap=False)[-1])


def test_a_gemma2_file_gets_gemmas_template(gemma2: tuple[Path, tuple[dict, dict]]) -> None:
    import openvino_genai

    folder, _ = gemma2
    tokenizer = openvino_genai.Tokenizer(str(folder))
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert rendered == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
