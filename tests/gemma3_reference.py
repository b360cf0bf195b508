"""Gemma 3's forward pass in numpy, written from transformers' Gemma3ForCausalLM (the
reference the graph builder is checked against; it shares no code with ovtrio).

Weights are a GGUF file's, dequantized by the gguf package: norm weights as llama.cpp
writes them, with Gemma's +1 already added."""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np


def read_gguf(path: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The file's metadata (without the tokenizer's) and each tensor dequantized by the
    gguf package, in its shape (rows last-but-one)."""
    from gguf.quants import dequantize

    metadata, tensors = _gguf_contents(path)
    weights = {}
    for name, (qtype, shape, rows) in tensors.items():
        # Up to 64 rows a row: gguf dequantizes 16 rows a numpy call, each block alone.
        together = math.gcd(rows.shape[0], 64)
        blocks = rows.reshape(rows.shape[0] // together, -1)
        weights[name] = np.asarray(dequantize(blocks, qtype), np.float32).reshape(shape)
    return metadata, weights


# GGUF value types: struct formats of the scalars (8 is a string, 9 an array).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def _gguf_contents(path: str) -> tuple[dict[str, Any], dict[str, tuple[Any, list[int], np.ndarray]]]:
    """The GGUF file's metadata but the tokenizer's, and per tensor its type, shape (rows
    last-but-one) and blocks as bytes [rows, row bytes], read from the format (gguf's
    GGUFReader takes ~10 s to build its fields of a 262k-token vocabulary, which is
    skipped here)."""
    import gguf

    data = np.memmap(path, dtype=np.uint8, mode="r")
    raw = memoryview(data)  # type: ignore[arg-type]
    offset = 0

    def take(fmt: str) -> Any:
        nonlocal offset
        (value,) = struct.unpack_from("<" + fmt, raw, offset)
        offset += struct.calcsize(fmt)
        return value

    def string() -> str:
        nonlocal offset
        length = take("Q")
        offset += length
        return bytes(raw[offset - length : offset]).decode("utf-8")

    def value(kind: int, keep: bool) -> Any:
        nonlocal offset
        if kind == 8:
            if keep:
                return string()
            length = take("Q")
            offset += length
            return None
        if kind == 9:
            item, count = take("I"), take("Q")
            if item in _SCALARS and not keep:
                offset += count * struct.calcsize(_SCALARS[item])
                return None
            return [value(item, keep) for _ in range(count)]
        return take(_SCALARS[kind])

    assert bytes(raw[:4]) == b"GGUF" and struct.unpack_from("<I", raw, 4)[0] == 3
    offset = 8
    tensor_count, field_count = take("Q"), take("Q")
    metadata: dict[str, Any] = {"GGUF.version": 3, "GGUF.tensor_count": tensor_count, "GGUF.kv_count": field_count}
    for _ in range(field_count):
        key = string()
        keep = not key.startswith("tokenizer.ggml.")
        found = value(take("I"), keep)
        if keep:
            metadata[key] = found
    infos = []
    for _ in range(tensor_count):
        name = string()
        dims = [take("Q") for _ in range(take("I"))]
        infos.append((name, dims, gguf.GGMLQuantizationType(take("I")), take("Q")))
    alignment = metadata.get("general.alignment", 32)
    start = -(-offset // alignment) * alignment
    tensors = {}
    for name, dims, qtype, at in infos:
        block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        row_bytes = dims[0] // block * block_bytes
        rows = int(np.prod(dims[1:], dtype=np.int64))
        blocks = data[start + at : start + at + rows * row_bytes].reshape(rows, row_bytes)
        tensors[name] = (qtype, list(reversed(dims)), blocks)
    return metadata, tensors


def _rms(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    mean = (x.astype(np.float64) ** 2).mean(-1, keepdims=True)
    return (x / np.sqrt(mean + eps)).astype(np.float32) * weight


def _rope(x: np.ndarray, theta: float, scale: float) -> np.ndarray:
    length, _heads, dim = x.shape
    inverse = 1.0 / theta ** (np.arange(0, dim, 2) / dim) / scale
    angles = np.arange(length)[:, None] * inverse[None]
    angles = np.concatenate([angles, angles], -1)[:, None]
    first, second = x[..., : dim // 2], x[..., dim // 2 :]
    return (x * np.cos(angles) + np.concatenate([-second, first], -1) * np.sin(angles)).astype(np.float32)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def forward(
    metadata: dict[str, Any], weights: dict[str, np.ndarray], ids: list[int], window: bool = True
) -> np.ndarray:
    """Logits [len(ids), vocab] for the prompt `ids`; `window=False` lets the local layers
    see every position (to show that the window matters)."""
    a = "gemma3"
    hidden = metadata[f"{a}.embedding_length"]
    heads = metadata[f"{a}.attention.head_count"]
    kv_heads = metadata[f"{a}.attention.head_count_kv"]
    head_dim = metadata[f"{a}.attention.key_length"]
    eps = metadata[f"{a}.attention.layer_norm_rms_epsilon"]
    sliding = metadata[f"{a}.attention.sliding_window"]
    base = metadata[f"{a}.rope.freq_base"]
    scale = metadata.get(f"{a}.rope.scaling.factor", 1.0)
    length = len(ids)
    x = weights["token_embd.weight"][np.asarray(ids)] * np.float32(np.sqrt(hidden))
    query, key = np.arange(length)[:, None], np.arange(length)[None]
    for layer in range(metadata[f"{a}.block_count"]):
        p = f"blk.{layer}."
        local = (layer + 1) % 6 != 0
        h = _rms(x, weights[p + "attn_norm.weight"], eps)
        q = (h @ weights[p + "attn_q.weight"].T).reshape(length, heads, head_dim)
        k = (h @ weights[p + "attn_k.weight"].T).reshape(length, kv_heads, head_dim)
        v = (h @ weights[p + "attn_v.weight"].T).reshape(length, kv_heads, head_dim)
        q = _rms(q, weights[p + "attn_q_norm.weight"], eps)
        k = _rms(k, weights[p + "attn_k_norm.weight"], eps)
        q = _rope(q, 10_000.0 if local else base, 1.0 if local else scale)
        k = _rope(k, 10_000.0 if local else base, 1.0 if local else scale)
        allowed = key <= query
        if local and window:
            allowed &= key > query - sliding
        context = np.empty((length, heads, head_dim), np.float32)
        for head in range(heads):
            kv = head // (heads // kv_heads)
            scores = np.where(allowed, (q[:, head] @ k[:, kv].T) * head_dim**-0.5, -np.inf)
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            context[:, head] = (scores / scores.sum(-1, keepdims=True)) @ v[:, kv]
        out = context.reshape(length, heads * head_dim) @ weights[p + "attn_output.weight"].T
        x = x + _rms(out, weights[p + "post_attention_norm.weight"], eps)
        h = _rms(x, weights[p + "ffn_norm.weight"], eps)
        mlp = _gelu_tanh(h @ weights[p + "ffn_gate.weight"].T) * (h @ weights[p + "ffn_up.weight"].T)
        x = x + _rms(mlp @ weights[p + "ffn_down.weight"].T, weights[p + "post_ffw_norm.weight"], eps)
    x = _rms(x, weights["output_norm.weight"], eps)
    return x @ weights.get("output.weight", weights["token_embd.weight"]).T
