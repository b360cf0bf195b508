"""The builder's llama-shaped dense architectures (dense.py: SmolLM3, Granite, OLMo 2,
Ministral 3) against an independent numpy forward pass (dense_reference.py) on
random-weight GGUF files in llama.cpp's layout: the query and key rows its conversion
reorders for its interleaved rotation, SmolLM3's layers without rotary embeddings,
Granite's four multipliers, OLMo 2's post-norms and whole-projection query and key norms,
Ministral 3's head size, YaRN and query temperature. Compared as test_gguf_builder.py
compares."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import RunningServer, running_server
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


EXACT_FLAGS = (
    "--inference-precision",
    "f32",
    "--kv-cache-precision",
    "f32",
    "--plugin-config",
    '{"DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}',
)


@pytest.fixture(scope="module")
def mistral3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    file = write_dense(tmp_path_factory.mktemp("mistral3-file") / "ministral.gguf", "mistral3")
    with running_server(
        tmp_path_factory.mktemp("mistral3-server"),
        "--model",
        str(file),
        "--served-model-name",
        "ministral",
        *EXACT_FLAGS,
    ) as server:
        yield server, file


def test_ovtrio_serve_serves_a_mistral3_file(mistral3_server: tuple[RunningServer, Path]) -> None:
    """`ovtrio serve --model ministral.gguf`: completions and chat, streamed and not, say the
    same; the chat prompt is Mistral's with one BOS; and the served first token's logprob
    is the reference model's on the served prompt's own tokens (its BOS first)."""
    import openai

    server, file = mistral3_server
    assert "no chat template: using the mistral family's own" in server.log_path.read_text()
    client = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=600)
    prompt = "Hello the world"
    unary = client.completions.create(model="ministral", prompt=prompt, max_tokens=8, temperature=0, logprobs=1)
    streamed = client.completions.create(model="ministral", prompt=prompt, max_tokens=8, temperature=0, stream=True)
    assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == unary.choices[0].text

    def tokenized(text: str, special: bool) -> dict[str, Any]:
        body = {"model": "ministral", "prompt": text, "add_special_tokens": special}
        return client.post("/tokenize", body=body, cast_to=object)  # type: ignore[return-value]

    ids = tokenized(prompt, True)["tokens"]
    assert ids == tokenized("<s>", False)["tokens"] + tokenized(prompt, False)["tokens"]  # the file's add_bos
    logprobs = unary.choices[0].logprobs
    assert logprobs is not None and logprobs.token_logprobs and logprobs.tokens
    first = tokenized(logprobs.tokens[0], False)["tokens"][0]
    metadata, weights = read_gguf(str(file))
    shifted = forward(metadata, weights, ids)[-1]
    shifted = shifted - shifted.max()
    expected = float(shifted[first] - np.log(np.exp(shifted).sum()))
    assert abs(float(logprobs.token_logprobs[0]) - expected) < 1e-3

    messages: Any = [{"role": "user", "content": prompt}]
    chat = client.chat.completions.create(model="ministral", messages=messages, max_tokens=8, temperature=0)
    chat_stream = client.chat.completions.create(
        model="ministral", messages=messages, max_tokens=8, temperature=0, stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chat_stream if chunk.choices)
    assert text == (chat.choices[0].message.content or "")
    assert chat.usage is not None
    assert chat.usage.prompt_tokens == tokenized("<s>[INST]Hello the world[/INST]", False)["count"]
