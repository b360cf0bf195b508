"""The builder's llama-shaped dense architectures (dense.py: SmolLM3, Granite, OLMo 2,
Ministral 3) against an independent numpy forward pass (dense_reference.py) on
random-weight GGUF files in llama.cpp's layout: the query and key rows its conversion
reorders for its interleaved rotation, SmolLM3's layers without rotary embeddings,
Granite's four multipliers, OLMo 2's post-norms and whole-projection query and key norms,
Ministral 3's head size, YaRN and query temperature. Compared as test_gguf_builder.py
compares."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dense_reference import PERMUTED, forward, read_gguf
from gguf_architectures import write_dense
from ovtrio.gguf.builder.folder import write_ir_folder
from test_gguf_builder import _stateful_logits, assert_paged_greedy_is_the_graphs

PROMPT = [*range(40, 260, 6)]  # 37 byte tokens


@pytest.fixture(scope="module", params=["smollm3", "granite", "olmo2", "mistral3"])
def dense(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple[dict, dict]]:
    architecture = request.param
    file = write_dense(
        tmp_path_factory.mktemp(architecture) / f"{architecture}.gguf", architecture, tied=architecture != "olmo2"
    )
    folder = tmp_path_factory.mktemp(f"{architecture}-ir")
    write_ir_folder(file, folder)
    return folder, read_gguf(str(file))


def test_the_graph_gives_the_reference_logits(dense: tuple[Path, tuple[dict, dict]]) -> None:
    folder, (metadata, weights) = dense
    expected = forward(metadata, weights, PROMPT)
    got = _stateful_logits(folder, PROMPT)
    difference = float(np.abs(got - expected).max())
    assert difference < 1e-4 * float(np.abs(expected).max()) + 1e-5, difference
    architecture = metadata["general.architecture"]
    if architecture == "smollm3":  # the no-rope layer is no rounding matter
        roped = forward(metadata, weights, PROMPT, rope_everywhere=True)
        assert float(np.abs(roped - expected).max()) > 100 * difference
    if architecture in PERMUTED:  # nor is the order llama.cpp's conversion left the rows in
        unordered = forward(metadata, weights, PROMPT, halves=True)
        assert float(np.abs(unordered - expected).max()) > 100 * difference
    if architecture == "mistral3":  # nor the queries' temperature past the original context
        cold = forward(metadata, weights, PROMPT, temperature=False)
        assert float(np.abs(cold - expected).max()) > 100 * difference


def test_the_paged_pipeline_gives_the_graphs_greedy_tokens(dense: tuple[Path, tuple[dict, dict]]) -> None:
    folder, (metadata, weights) = dense
    assert_paged_greedy_is_the_graphs(folder, PROMPT, forward(metadata, weights, PROMPT)[-1])


def test_a_file_without_a_template_gets_its_familys(dense: tuple[Path, tuple[dict, dict]]) -> None:
    import openvino_genai

    folder, (metadata, _) = dense
    rendered = openvino_genai.Tokenizer(str(folder)).apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True
    )
    expected = {
        "smollm3": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        "granite": "<|start_of_role|>user<|end_of_role|>Hi<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>",
        "olmo2": "<|endoftext|><|user|>\nHi\n<|assistant|>\n",
        "mistral3": "<s>[INST]Hi[/INST]",
    }
    assert rendered == expected[metadata["general.architecture"]]


def test_a_file_whose_tensors_do_not_fit_its_header_fails_its_build_in_one_line(tmp_path: Path) -> None:
    """A header that says 3 heads over tensors written for 4: the build child refuses it
    with one line naming what did not fit, and the server's process never sees it."""
    import gguf

    from ovtrio.gguf.builder.child import BuildError, build_in_child

    good = write_dense(tmp_path / "good.gguf", "smollm3")
    reader = gguf.GGUFReader(str(good), "r+")
    field = reader.fields["smollm3.attention.head_count"]
    field.parts[field.data[0]][0] = 3  # the memory map writes through to the file
    del reader
    with pytest.raises(BuildError) as refused:
        build_in_child(good, tmp_path / "built")
    assert "\n" not in str(refused.value) and str(refused.value)
