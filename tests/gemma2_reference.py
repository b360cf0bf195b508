"""Gemma 2's forward pass in numpy, written from transformers' Gemma2ForCausalLM in its
eager attention (the reference the graph builder is checked against; it shares no code
with ovtrio). Weights are a GGUF file's, dequantized by the gguf package: norm weights
as llama.cpp writes them, with Gemma's +1 already added."""

from __future__ import annotations

from typing import Any

import numpy as np

from gemma3_reference import read_gguf

__all__ = ["forward", "read_gguf"]


def _rms(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    mean = (x.astype(np.float64) ** 2).mean(-1, keepdims=True)
    return (x / np.sqrt(mean + eps)).astype(np.float32) * weight


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def forward(
    metadata: dict[str, Any],
    weights: dict[str, np.ndarray],
    ids: list[int],
    window: bool = True,
    attention_softcap: bool = True,
) -> np.ndarray:
    """Logits [len(ids), vocab]. `attention_softcap=False` leaves the attention scores
    uncapped (as SDPA attention computes Gemma 2); `window=False` lets the sliding layers
    see every position."""
    a = "gemma2"
    hidden = metadata[f"{a}.embedding_length"]
    heads = metadata[f"{a}.attention.head_count"]
    kv_heads = metadata[f"{a}.attention.head_count_kv"]
    head_dim = metadata[f"{a}.attention.key_length"]
    eps = metadata[f"{a}.attention.layer_norm_rms_epsilon"]
    sliding = metadata[f"{a}.attention.sliding_window"]
    base = metadata[f"{a}.rope.freq_base"]
    attention_cap = metadata[f"{a}.attn_logit_softcapping"]
    final_cap = metadata[f"{a}.final_logit_softcapping"]
    length = len(ids)

    inverse = 1.0 / base ** (np.arange(0, head_dim, 2) / head_dim)
    angles = np.arange(length)[:, None] * inverse[None]
    angles = np.concatenate([angles, angles], -1)[:, None]

    def rope(x: np.ndarray) -> np.ndarray:
        first, second = x[..., : head_dim // 2], x[..., head_dim // 2 :]
        return (x * np.cos(angles) + np.concatenate([-second, first], -1) * np.sin(angles)).astype(np.float32)

    x = weights["token_embd.weight"][np.asarray(ids)] * np.float32(np.sqrt(hidden))
    query, key = np.arange(length)[:, None], np.arange(length)[None]
    for layer in range(metadata[f"{a}.block_count"]):
        p = f"blk.{layer}."
        sliding_layer = layer % 2 == 0  # transformers: is_sliding = not bool(layer_idx % 2)
        h = _rms(x, weights[p + "attn_norm.weight"], eps)
        q = rope((h @ weights[p + "attn_q.weight"].T).reshape(length, heads, head_dim))
        k = rope((h @ weights[p + "attn_k.weight"].T).reshape(length, kv_heads, head_dim))
        v = (h @ weights[p + "attn_v.weight"].T).reshape(length, kv_heads, head_dim)
        allowed = key <= query
        if sliding_layer and window:
            allowed &= key > query - sliding
        context = np.empty((length, heads, head_dim), np.float32)
        for head in range(heads):
            kv = head // (heads // kv_heads)
            scores = (q[:, head] @ k[:, kv].T) * head_dim**-0.5
            if attention_softcap:
                scores = np.tanh(scores / attention_cap) * attention_cap
            scores = np.where(allowed, scores, -np.inf)
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            context[:, head] = (scores / scores.sum(-1, keepdims=True)) @ v[:, kv]
        out = context.reshape(length, heads * head_dim) @ weights[p + "attn_output.weight"].T
        x = x + _rms(out, weights[p + "post_attention_norm.weight"], eps)
        h = _rms(x, weights[p + "ffn_norm.weight"], eps)
        mlp = _gelu_tanh(h @ weights[p + "ffn_gate.weight"].T) * (h @ weights[p + "ffn_up.weight"].T)
        x = x + _rms(mlp @ weights[p + "ffn_down.weight"].T, weights[p + "post_ffw_norm.weight"], eps)
    x = _rms(x, weights["output_norm.weight"], eps)
    logits = x @ weights.get("output.weight", weights["token_embd.weight"]).T
    return np.tanh(logits / final_cap) * final_cap
