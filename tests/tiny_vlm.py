"""Build a tiny vision-language model folder (llava type, random weights) in seconds.

A test fixture, not a model: its text is nonsense, but OpenVINO GenAI's VLMPipeline and
ContinuousBatchingPipeline both load it on CPU in VLM mode, different images give
different greedy outputs, and the prompt grows by the image's tokens. So tests can show
that images reach the engine without downloading a real VLM.

How it is made (about 5 s):

1. A llama GGUF with random f16 weights (2 layers, hidden 64) and the embedded SmolLM2
   model's tokenizer, with `<image>` appended as a control token (llava's image token is
   that literal string, which the tokenizer must keep as one token).
2. `LLMPipeline(gguf, enable_save_ov_model=True)` converts it and writes the stateful
   `openvino_model.xml` and both tokenizer IRs.
3. The graph is cut at the token embedding: the embedding's Gather becomes the text
   embeddings model (`input_ids` -> embeddings), and the language model takes an
   `inputs_embeds` parameter in its place (its other use of `input_ids`, a ShapeOf for
   the causal mask, reads the first two dimensions of `inputs_embeds` instead).
4. The vision embeddings model is an 8x8 patchify convolution, GELU and a linear
   projection to the hidden size, built with openvino's opset: a 32x32 crop gives 16
   image tokens.

The folder holds no `openvino_model.xml` (GenAI would read it before
`openvino_language_model.xml`). Token embeddings are kept small (x0.25) so that image
features outweigh the text around them.

    python tests/tiny_vlm.py /tmp/tiny-vlm
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ovtrio.model import embedded_model_path

IMAGE_TOKEN = "<image>"
HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
FFN = 128
PATCH = 8
CROP = 32
VISION_CHANNELS = 32
# Image tokens per image: one per patch of the crop.
IMAGE_TOKENS = (CROP // PATCH) ** 2
CONTROL_TOKEN_TYPE = 3  # llama.cpp's token type for control tokens


def write_language_gguf(path: Path, seed: int = 0) -> int:
    """A tiny llama GGUF with the embedded tokenizer plus IMAGE_TOKEN; returns that
    token's id."""
    import gguf

    reader = gguf.GGUFReader(embedded_model_path())
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("tiny llava fixture (random weights)")
    writer.add_context_length(2048)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    vocab_size = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        main_type = field.types[0]
        sub_type = field.types[-1] if main_type == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if name == "tokenizer.ggml.tokens":
            value = [*value, IMAGE_TOKEN]
            vocab_size = len(value)
        elif name == "tokenizer.ggml.token_type":
            value = [*value, CONTROL_TOKEN_TYPE]
        elif name == "tokenizer.ggml.scores":
            value = [*value, 0.0]
        writer.add_key_value(name, value, main_type, sub_type=sub_type)
    writer.add_vocab_size(vocab_size)

    rng = np.random.default_rng(seed)
    kv_dim = HIDDEN // HEADS * KV_HEADS

    def matrix(name: str, rows: int, cols: int, std: float) -> None:
        writer.add_tensor(name, (rng.standard_normal((rows, cols)) * std).astype(np.float16))

    def norm(name: str) -> None:
        writer.add_tensor(name, np.ones(HIDDEN, dtype=np.float32))

    matrix("token_embd.weight", vocab_size, HIDDEN, 0.25)
    for layer in range(LAYERS):
        prefix = f"blk.{layer}."
        norm(prefix + "attn_norm.weight")
        matrix(prefix + "attn_q.weight", HIDDEN, HIDDEN, 0.2)
        matrix(prefix + "attn_k.weight", kv_dim, HIDDEN, 0.2)
        matrix(prefix + "attn_v.weight", kv_dim, HIDDEN, 0.2)
        matrix(prefix + "attn_output.weight", HIDDEN, HIDDEN, 0.2)
        norm(prefix + "ffn_norm.weight")
        matrix(prefix + "ffn_gate.weight", FFN, HIDDEN, 0.2)
        matrix(prefix + "ffn_up.weight", FFN, HIDDEN, 0.2)
        matrix(prefix + "ffn_down.weight", HIDDEN, FFN, 0.2)
    norm("output_norm.weight")
    matrix("output.weight", vocab_size, HIDDEN, 0.5)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return vocab_size - 1


def _split_language_model(converted: Path, folder: Path) -> None:
    """Cut the converted model at its token embedding: the embedding becomes the text
    embeddings model, the rest the language model taking `inputs_embeds`."""
    import openvino as ov
    from openvino import opset13 as ops

    model = ov.Core().read_model(converted / "openvino_model.xml")
    input_ids = next(p for p in model.get_parameters() if "input_ids" in p.output(0).get_names())
    uses = [target.get_node() for target in input_ids.output(0).get_target_inputs()]
    convert = next(node for node in uses if node.get_type_name() == "Convert")
    shape_of = next(node for node in uses if node.get_type_name() == "ShapeOf")
    gather = next(
        target.get_node()
        for target in convert.output(0).get_target_inputs()
        if target.get_node().get_type_name() == "Gather"
    )

    text_ids = ops.parameter([-1, -1], ov.Type.i64, name="input_ids")
    text_ids.output(0).set_names({"input_ids"})
    text_embeddings = ops.gather(
        gather.input_value(0), ops.convert(text_ids, gather.input(1).get_element_type()), gather.input_value(2)
    )
    text_model = ov.Model([ops.result(text_embeddings)], [text_ids], "text_embeddings")

    inputs_embeds = ops.parameter([-1, -1, HIDDEN], ov.Type.f32, name="inputs_embeds")
    inputs_embeds.output(0).set_names({"inputs_embeds"})
    for target in list(gather.output(0).get_target_inputs()):
        target.replace_source_output(inputs_embeds.output(0))
    batch_and_length = ops.slice(
        ops.shape_of(inputs_embeds, shape_of.get_output_element_type(0)),
        np.array([0]),
        np.array([2]),
        np.array([1]),
    )
    for target in list(shape_of.output(0).get_target_inputs()):
        target.replace_source_output(batch_and_length.output(0))
    parameters = [inputs_embeds] + [p for p in model.get_parameters() if p is not input_ids]
    language_model = ov.Model(model.get_results(), model.get_sinks(), parameters, "language_model")
    language_model.validate_nodes_and_infer_types()
    ov.save_model(language_model, folder / "openvino_language_model.xml", compress_to_fp16=False)
    ov.save_model(text_model, folder / "openvino_text_embeddings_model.xml", compress_to_fp16=False)


def _write_vision_model(folder: Path, seed: int) -> None:
    import openvino as ov
    from openvino import opset13 as ops

    rng = np.random.default_rng(seed + 1)
    pixels = ops.parameter([-1, 3, -1, -1], ov.Type.f32, name="pixel_values")
    pixels.output(0).set_names({"pixel_values"})
    kernel = (rng.standard_normal((VISION_CHANNELS, 3, PATCH, PATCH)) * 0.2).astype(np.float32)
    patches = ops.convolution(pixels, ops.constant(kernel), [PATCH, PATCH], [0, 0], [0, 0], [1, 1])
    batch_and_channels = ops.gather(ops.shape_of(patches, ov.Type.i64), np.array([0, 1]), np.array(0))
    flat = ops.reshape(patches, ops.concat([batch_and_channels, np.array([-1], dtype=np.int64)], 0), False)
    tokens = ops.gelu(ops.transpose(flat, np.array([0, 2, 1])), "erf")
    projector = (rng.standard_normal((VISION_CHANNELS, HIDDEN))).astype(np.float32)
    features = ops.matmul(tokens, ops.constant(projector), False, False)
    features.output(0).set_names({"last_hidden_state"})
    model = ov.Model([ops.result(features)], [pixels], "vision_embeddings")
    ov.save_model(model, folder / "openvino_vision_embeddings_model.xml", compress_to_fp16=False)


def build(folder: Path, seed: int = 0) -> Path:
    """Write the tiny VLM into `folder` (created; must not hold a model yet)."""
    import openvino_genai

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tiny-vlm-") as scratch:
        converted = Path(scratch)
        image_token_id = write_language_gguf(converted / "language.gguf", seed)
        # Converting writes openvino_model.xml and the tokenizer IRs beside the GGUF.
        openvino_genai.LLMPipeline(str(converted / "language.gguf"), "CPU", enable_save_ov_model=True)
        _split_language_model(converted, folder)
        for name in ("openvino_tokenizer", "openvino_detokenizer"):
            for suffix in (".xml", ".bin"):
                shutil.copy(converted / (name + suffix), folder / (name + suffix))
    _write_vision_model(folder, seed)
    config = {
        "model_type": "llava",
        "architectures": ["LlavaForConditionalGeneration"],
        "image_token_index": image_token_id,
        "hidden_size": HIDDEN,
        "text_config": {"model_type": "llama", "hidden_size": HIDDEN, "vocab_size": image_token_id + 1},
        "vision_config": {"model_type": "clip_vision_model", "patch_size": PATCH, "image_size": CROP},
    }
    preprocessor = {
        "size": {"shortest_edge": CROP},
        "crop_size": {"height": CROP, "width": CROP},
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "patch_size": PATCH,
        "do_resize": True,
        "do_center_crop": True,
    }
    generation = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
    for name, content in (
        ("config.json", config),
        ("preprocessor_config.json", preprocessor),
        ("generation_config.json", generation),
    ):
        (folder / name).write_text(json.dumps(content, indent=1))
    return folder


def add_bos_to_tokenizer(folder: Path) -> Path:
    """Replace the tiny VLM's tokenizer by one that adds BOS (`<|im_start|>`, id 1) to
    what it encodes, as Gemma's and Llama's do, with the same vocabulary and chat
    template (which begins with that token too, as a template that writes BOS does):
    built with Hugging Face's tokenizers and converted by openvino_tokenizers (about
    15 s)."""
    import gguf
    import openvino as ov
    import openvino_tokenizers
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    reader = gguf.GGUFReader(embedded_model_path())
    tokens = [*reader.fields["tokenizer.ggml.tokens"].contents(), IMAGE_TOKEN]
    types = [*reader.fields["tokenizer.ggml.token_type"].contents(), CONTROL_TOKEN_TYPE]
    merges = [tuple(merge.split(" ", 1)) for merge in reader.fields["tokenizer.ggml.merges"].contents()]
    bpe = Tokenizer(models.BPE({token: i for i, token in enumerate(tokens)}, merges))
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    bpe.decoder = decoders.ByteLevel()
    control = [AddedToken(token, special=True) for token, kind in zip(tokens, types) if kind == CONTROL_TOKEN_TYPE]
    bpe.add_special_tokens(control)
    bos = tokens[1]
    bpe.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, 1)]
    )
    hf = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=bos, eos_token=tokens[2])
    hf.chat_template = reader.fields["tokenizer.chat_template"].contents()
    tokenizer, detokenizer = openvino_tokenizers.convert_tokenizer(hf, with_detokenizer=True)
    ov.save_model(tokenizer, folder / "openvino_tokenizer.xml")
    ov.save_model(detokenizer, folder / "openvino_detokenizer.xml")
    return folder


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("tiny-vlm")
    started = time.perf_counter()
    build(target)
    size = sum(f.stat().st_size for f in target.iterdir())
    print(f"wrote {target} ({size / 1e6:.0f} MB) in {time.perf_counter() - started:.1f} s")
