"""ovtrio's own model builder (ovtrio/gguf/builder/) against an independent numpy forward
pass (gemma3_reference.py), on random-weight GGUF files of the family's layout.

Compared in f32 inference with the activations' dynamic quantization off (the plugin's
default quantizes the activations of compressed-weight products to 8 bits, for the
engine's own GGUF models too): what is left is float rounding."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from gemma3_reference import forward, read_gguf
from gguf_architectures import GEMMA3_TYPES, write_gemma3
from ovtrio.gguf.builder import BUILT_ARCHITECTURES
from ovtrio.gguf.builder.folder import ARCHITECTURES, write_ir_folder
from ovtrio.gguf.builder.weights import KEPT_TYPES, decode

EXACT = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}
WINDOW = 8
PROMPT = [2, *range(6, 262, 7)]  # BOS and 37 byte tokens: longer than the window, past it many times


@pytest.fixture(scope="module")
def gemma3_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gemma3(tmp_path_factory.mktemp("gemma3") / "tiny-gemma3.gguf", window=WINDOW)


@pytest.fixture(scope="module")
def gemma3_folder(gemma3_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("gemma3-ir")
    write_ir_folder(gemma3_file, folder)
    return folder


@pytest.fixture(scope="module")
def reference(gemma3_file: Path) -> tuple[dict, dict]:
    return read_gguf(str(gemma3_file))


def _stateful_logits(folder: Path, ids: list[int]) -> np.ndarray:
    import openvino as ov

    compiled = ov.Core().compile_model(folder / "openvino_model.xml", "CPU", EXACT)
    request = compiled.create_infer_request()
    result = request.infer(
        {
            "input_ids": np.array([ids]),
            "attention_mask": np.ones((1, len(ids)), np.int64),
            "position_ids": np.arange(len(ids))[None],
            "beam_idx": np.zeros(1, np.int32),
        }
    )
    return np.asarray(result[compiled.output("logits")][0])


def _stateful_greedy(folder: Path, ids: list[int], count: int) -> list[int]:
    """Greedy tokens from the stateful graph, one position a call after the prompt."""
    import openvino as ov

    compiled = ov.Core().compile_model(folder / "openvino_model.xml", "CPU", EXACT)
    request = compiled.create_infer_request()
    seen, chosen = list(ids), []
    step_ids, positions = np.array([ids]), np.arange(len(ids))[None]
    for _ in range(count):
        result = request.infer(
            {
                "input_ids": step_ids,
                "attention_mask": np.ones((1, len(seen)), np.int64),
                "position_ids": positions,
                "beam_idx": np.zeros(1, np.int32),
            }
        )
        token = int(np.asarray(result[compiled.output("logits")])[0, -1].argmax())
        chosen.append(token)
        seen.append(token)
        step_ids, positions = np.array([[token]]), np.array([[len(seen) - 1]])
    return chosen


def _paged_output(folder: Path, ids: list[int], count: int) -> Any:
    """`count` greedy tokens (with their logprobs) from the continuous-batching pipeline,
    its prefill sliced into steps of 16 tokens, smaller than the prompts here."""
    import openvino as ov
    import openvino_genai

    scheduler = openvino_genai.SchedulerConfig()
    scheduler.max_num_batched_tokens = 16
    scheduler.num_kv_blocks = 16
    scheduler.enable_prefix_caching = False
    pipeline = openvino_genai.ContinuousBatchingPipeline(str(folder), scheduler, "CPU", EXACT)
    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = count
    config.ignore_eos = True
    config.logprobs = 1
    handle = pipeline.add_request(0, ov.Tensor(np.array([ids], np.int64)), config)
    while pipeline.has_non_finished_requests():
        pipeline.step()
    return handle.read_all()[0]


def assert_paged_greedy_is_the_graphs(folder: Path, ids: list[int], reference_last_logits: np.ndarray) -> None:
    """The paged pipeline's 12 greedy tokens (prefill sliced smaller than `ids`) are the
    stateful graph's, and its first token's logprob is the reference's within 1e-3."""
    output = _paged_output(folder, ids, 12)
    assert list(output.generated_ids) == _stateful_greedy(folder, ids, 12)
    shifted = reference_last_logits - reference_last_logits.max()
    expected = float(shifted[output.generated_ids[0]] - np.log(np.exp(shifted).sum()))
    assert abs(float(output.generated_log_probs[0]) - expected) < 1e-3


def test_the_names_of_built_architectures_are_the_builders_table() -> None:
    assert frozenset(ARCHITECTURES) == BUILT_ARCHITECTURES


def test_codes_scales_and_zero_points_give_the_files_values(gemma3_file: Path) -> None:
    """Each kept type's codes stand for exactly what llama.cpp dequantizes."""
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(gemma3_file)
    checked = set()
    for tensor in reader.tensors:
        type_name = tensor.tensor_type.name
        if type_name not in KEPT_TYPES or type_name in checked:
            continue
        checked.add(type_name)
        shape = [int(n) for n in reversed(tensor.shape)]
        expected = np.asarray(dequantize(tensor.data, tensor.tensor_type), np.float32).reshape(shape)
        codes = decode(np.asarray(tensor.data), type_name, shape[0])
        assert codes.codes.max() < 2**codes.bits
        np.testing.assert_allclose(codes.values(), expected, rtol=1e-6, atol=1e-7 * np.abs(expected).max())
    assert checked == set(GEMMA3_TYPES.values()) | {"Q8_0"}


def test_the_built_graph_computes_the_reference_logits(gemma3_folder: Path, reference: tuple[dict, dict]) -> None:
    metadata, weights = reference
    expected = forward(metadata, weights, PROMPT)
    got = _stateful_logits(gemma3_folder, PROMPT)
    difference = float(np.abs(got - expected).max())
    assert difference < 1e-4 * float(np.abs(expected).max()) + 1e-4, difference
    # The window is what the local layers see: without it the reference is far from the graph.
    unwindowed = forward(metadata, weights, PROMPT, window=False)
    assert float(np.abs(unwindowed - expected).max()) > 100 * difference


def test_the_paged_pipeline_keeps_the_window_and_gives_the_graphs_greedy_tokens(
    gemma3_folder: Path, reference: tuple[dict, dict]
) -> None:
    """The continuous-batching pipeline turns each attention into its paged attention: the
    local layers' window must survive the rewrite (taken from the mask's pattern), in a
    prefill sliced smaller than the prompt."""
    output = _paged_output(gemma3_folder, PROMPT, 12)
    tokens = list(output.generated_ids)
    assert tokens == _stateful_greedy(gemma3_folder, PROMPT, 12)

    metadata, weights = reference

    def logprob(logits: np.ndarray) -> float:
        shifted = logits - logits.max()
        return float(shifted[tokens[0]] - np.log(np.exp(shifted).sum()))

    windowed = logprob(forward(metadata, weights, PROMPT)[-1])
    unwindowed = logprob(forward(metadata, weights, PROMPT, window=False)[-1])
    engine = float(output.generated_log_probs[0])
    assert abs(engine - windowed) < 1e-3
    assert abs(engine - windowed) < abs(engine - unwindowed) / 10


def test_the_rebuilt_tokenizer_keeps_control_tokens_whole_and_round_trips(gemma3_folder: Path) -> None:
    import openvino_genai

    tokenizer = openvino_genai.Tokenizer(str(gemma3_folder))
    for text in ("Hello world", "the wor ld, ÄÖ ☃ 日本", "  two  spaces\n\nand lines"):
        ids = tokenizer.encode(text, add_special_tokens=False).input_ids.data[0].tolist()
        assert tokenizer.decode(ids) == text
    turn = tokenizer.encode("<start_of_turn>user", add_special_tokens=False).input_ids.data[0].tolist()
    assert turn[0] == 4  # <start_of_turn>: one control token
    with_bos = tokenizer.encode("Hello").input_ids.data[0].tolist()
    assert (
        with_bos[0] == 2
        and with_bos[1:] == tokenizer.encode("Hello", add_special_tokens=False).input_ids.data[0].tolist()
    )


def test_a_file_without_a_chat_template_gets_its_familys(gemma3_folder: Path) -> None:
    import openvino_genai

    tokenizer = openvino_genai.Tokenizer(str(gemma3_folder))
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert rendered == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
