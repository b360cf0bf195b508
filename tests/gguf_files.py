"""GGUF files in tensor types the engine cannot read, made with the gguf package.

Types the gguf package quantizes (Q5_0, Q5_1, BF16, MXFP4, ...) are written from the
embedded model's own weights, so the model stays a model; the others (K-quants, IQ
types) as random codes with finite scales (bench/make_tiny_llama.py's random_blocks),
a valid tensor of that type whose numbers are nonsense.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from ovtrio.model import embedded_model_path

ROOT = Path(__file__).resolve().parents[1]
QuantType = gguf.GGMLQuantizationType
# What the gguf package can write from float weights (and IQ4_NL, written here).
QUANTIZABLE = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "BF16", "MXFP4", "IQ4_NL"})


@cache
def tiny_llama() -> Any:
    """bench/make_tiny_llama.py as a module."""
    spec = importlib.util.spec_from_file_location("make_tiny_llama", ROOT / "bench" / "make_tiny_llama.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def blocks_of(weights: np.ndarray | None, rows: int, cols: int, type_name: str, rng: np.random.Generator) -> Any:
    """A [rows, cols] tensor of `type_name` as the bytes gguf writes: from `weights` when
    the package quantizes the type, else random."""
    if weights is not None and type_name == "F32":
        return weights.reshape(rows, cols).astype(np.float32)
    if weights is not None and type_name == "IQ4_NL":
        return iq4_nl(weights.reshape(rows, cols).astype(np.float32))
    if weights is not None and type_name in QUANTIZABLE:
        return gguf.quants.quantize(weights.reshape(rows, cols).astype(np.float32), QuantType[type_name])
    if weights is not None:  # a tenth of the weights' spread: the model's other layers still carry it
        return tiny_llama().random_blocks(rng, rows, cols, type_name, std=float(weights.std()) / 10)
    return tiny_llama().random_blocks(rng, rows, cols, type_name)


def iq4_nl(weights: np.ndarray) -> np.ndarray:
    """IQ4_NL blocks of `weights` ([rows, cols]): per 32 weights an f16 scale and the
    nearest of the type's 16 levels (the low nibbles hold the first 16 weights)."""
    levels = np.array(gguf.quants.IQ4_NL.kvalues, dtype=np.float32)
    blocks = weights.reshape(-1, 32)
    signed_max = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=1)[:, None], axis=1)
    d = (signed_max / np.float32(-127)).astype(np.float16)
    wide = d.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = np.where(wide != 0, blocks / wide, 0)
    # The nearest level, the lower of two as near.
    above = np.searchsorted(levels, scaled).clip(1, len(levels) - 1)
    nearer_above = np.abs(scaled - levels[above]) < np.abs(scaled - levels[above - 1])
    codes = np.where(nearer_above, above, above - 1).astype(np.uint8)
    packed = codes[:, :16] | (codes[:, 16:] << 4)
    return np.concatenate([d.view(np.uint8), packed], axis=1).reshape(weights.shape[0], -1)


def _copy_metadata(reader: gguf.GGUFReader, writer: gguf.GGUFWriter) -> None:
    for name, field in reader.fields.items():
        if name.startswith(("GGUF.", "general.architecture")):
            continue
        main = field.types[0]
        sub = field.types[-1] if main == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), main, sub_type=sub)


def requantized_embedded(
    path: Path,
    choose: Callable[[str, tuple[int, ...]], str | None],
    seed: int = 0,
    *,
    f16: Path | None = None,
    keep: frozenset[str] = frozenset({"F32", "F16"}),
) -> Path:
    """The embedded model with each tensor in the type `choose(name, ggml shape)` names
    (None: as it is). With `f16`, the same file is written there too with every tensor
    whose type is not in `keep` as F16 of gguf.quants.dequantize of its blocks: the file
    in the type the engine reads that is closest to exact. (Both in one pass: gguf's
    reader takes seconds over the model's vocabulary.)"""
    reader = gguf.GGUFReader(embedded_model_path())
    writers = [gguf.GGUFWriter(out, "llama") for out in (path, f16) if out is not None]
    for writer in writers:
        _copy_metadata(reader, writer)
    rng = np.random.default_rng(seed)
    for tensor in reader.tensors:
        shape = tuple(int(n) for n in tensor.shape)
        type_name = choose(tensor.name, shape)
        if type_name is None or type_name == tensor.tensor_type.name:
            type_name, data = tensor.tensor_type.name, np.asarray(tensor.data)
        else:
            weights = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            if type_name == "F16":
                data = weights.astype(np.float16)
            else:
                data = blocks_of(weights, shape[1], shape[0], type_name, rng)
        writers[0].add_tensor(tensor.name, data, raw_dtype=QuantType[type_name])
        if f16 is not None and type_name in keep:
            writers[1].add_tensor(tensor.name, data, raw_dtype=QuantType[type_name])
        elif f16 is not None:
            writers[1].add_tensor(tensor.name, gguf.quants.dequantize(data, QuantType[type_name]).astype(np.float16))
    for writer in writers:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return path


def padded_output(path: Path, scale: float = 0.95) -> Path:
    """The embedded model with an output layer of twice its vocabulary's rows (its tied
    embeddings, then the same rows times `scale`), as a model padded for speed is: a
    greedy choice stays within the vocabulary while the best logit is positive (its
    scaled copy is smaller), and sampling picks an id past it about one token in four."""
    reader = gguf.GGUFReader(embedded_model_path())
    writer = gguf.GGUFWriter(path, "llama")
    _copy_metadata(reader, writer)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.asarray(tensor.data), raw_dtype=tensor.tensor_type)
        if tensor.name == "token_embd.weight":
            rows = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            output = np.concatenate([rows, rows * np.float32(scale)]).astype(np.float32)
            writer.add_tensor("output.weight", gguf.quants.quantize(output, QuantType.Q8_0), raw_dtype=QuantType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def tensors_file(path: Path, types: list[str], rows: int = 16, cols: int = 512, seed: int = 0) -> Path:
    """A GGUF file (no model) holding one [rows, cols] tensor "w.<type>" of each type, and
    a norm-like vector, for the converter alone."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_file_type(gguf.LlamaFileType.GUESSED)
    writer.add_tensor("norm.weight", rng.normal(1.0, 0.1, size=cols).astype(np.float32))
    for type_name in types:
        weights = rng.normal(0.0, 0.02, size=(rows, cols)).astype(np.float32)
        writer.add_tensor(
            f"w.{type_name}", blocks_of(weights, rows, cols, type_name, rng), raw_dtype=QuantType[type_name]
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def dequantized(path: Path) -> dict[str, tuple[str, np.ndarray]]:
    """Each tensor's type and gguf.quants.dequantize of its blocks, [rows, row length]."""
    reader = gguf.GGUFReader(path)
    found = {}
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        found[tensor.name] = (tensor.tensor_type.name, values.reshape(-1, int(tensor.shape[0])))
    return found
