"""Phi-3's forward pass in numpy, written from transformers' Phi3ForCausalLM and its
LongRoPE initialisation (the reference the graph builder is checked against; it shares no
code with ovtrio). Weights are a GGUF file's, dequantized by the gguf package."""

from __future__ import annotations

from typing import Any

import numpy as np

from gemma3_reference import read_gguf

__all__ = ["forward", "read_gguf"]


def _rms(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    mean = (x.astype(np.float64) ** 2).mean(-1, keepdims=True)
    return (x / np.sqrt(mean + eps)).astype(np.float32) * weight


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


def forward(
    metadata: dict[str, Any],
    weights: dict[str, np.ndarray],
    ids: list[int],
    window: bool = True,
    factors: str = "long",
) -> np.ndarray:
    """Logits [len(ids), vocab]. `factors` ("long" or "short") is the LongRoPE factor set
    (transformers takes the long one past the original context); `window=False` drops the
    sliding window (to show that it matters)."""
    a = "phi3"
    hidden = metadata[f"{a}.embedding_length"]
    heads = metadata[f"{a}.attention.head_count"]
    kv_heads = metadata[f"{a}.attention.head_count_kv"]
    head_dim = hidden // heads
    rotary = metadata.get(f"{a}.rope.dimension_count", head_dim)
    eps = metadata[f"{a}.attention.layer_norm_rms_epsilon"]
    base = metadata[f"{a}.rope.freq_base"]
    sliding = metadata.get(f"{a}.attention.sliding_window")
    context = metadata[f"{a}.context_length"]
    original = metadata.get(f"{a}.rope.scaling.original_context_length")
    feed_forward = metadata[f"{a}.feed_forward_length"]

    inverse = 1.0 / base ** (np.arange(0, rotary, 2) / rotary)
    attention_factor = 1.0
    if original is not None:
        inverse = inverse / weights[f"rope_factors_{factors}.weight"]
        scale = context / original
        attention_factor = np.sqrt(1 + np.log(scale) / np.log(original)) if scale > 1 else 1.0
    length = len(ids)
    angles = np.arange(length)[:, None] * inverse[None]
    angles = np.concatenate([angles, angles], -1)[:, None]
    cos, sin = np.cos(angles) * attention_factor, np.sin(angles) * attention_factor

    def rope(x: np.ndarray) -> np.ndarray:
        turned, passed = x[..., :rotary], x[..., rotary:]
        first, second = turned[..., : rotary // 2], turned[..., rotary // 2 :]
        turned = turned * cos + np.concatenate([-second, first], -1) * sin
        return np.concatenate([turned, passed], -1).astype(np.float32)

    x = weights["token_embd.weight"][np.asarray(ids)]
    query, key = np.arange(length)[:, None], np.arange(length)[None]
    allowed = key <= query
    if window and sliding:
        allowed &= query - key < sliding
    for layer in range(metadata[f"{a}.block_count"]):
        p = f"blk.{layer}."
        h = _rms(x, weights[p + "attn_norm.weight"], eps)
        qkv = h @ weights[p + "attn_qkv.weight"].T
        q = rope(qkv[:, : heads * head_dim].reshape(length, heads, head_dim))
        k = rope(qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].reshape(length, kv_heads, head_dim))
        v = qkv[:, (heads + kv_heads) * head_dim :].reshape(length, kv_heads, head_dim)
        out = np.empty((length, heads, head_dim), np.float32)
        for head in range(heads):
            kv = head // (heads // kv_heads)
            scores = np.where(allowed, (q[:, head] @ k[:, kv].T) * head_dim**-0.5, -np.inf)
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            out[:, head] = (scores / scores.sum(-1, keepdims=True)) @ v[:, kv]
        x = x + out.reshape(length, -1) @ weights[p + "attn_output.weight"].T
        h = _rms(x, weights[p + "ffn_norm.weight"], eps)
        up = h @ weights[p + "ffn_up.weight"].T
        gate, up = up[:, :feed_forward], up[:, feed_forward:]
        x = x + (up * _silu(gate)) @ weights[p + "ffn_down.weight"].T
    x = _rms(x, weights["output_norm.weight"], eps)
    return x @ weights.get("output.weight", weights["token_embd.weight"]).T
