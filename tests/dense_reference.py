"""SmolLM3's, Granite's and OLMo 2's forward pass in numpy, written from transformers'
SmolLM3ForCausalLM, GraniteForCausalLM and Olmo2ForCausalLM (the reference the graph
builder is checked against; it shares no code with ovtrio). Weights are a GGUF file's,
dequantized by the gguf package."""

from __future__ import annotations

from typing import Any

import numpy as np

from gemma3_reference import read_gguf

__all__ = ["forward", "read_gguf"]


def _rms(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    mean = (x.astype(np.float64) ** 2).mean(-1, keepdims=True)
    return (x / np.sqrt(mean + eps)).astype(np.float32) * weight


def forward(metadata: dict[str, Any], weights: dict[str, np.ndarray], ids: list[int], rope_everywhere: bool = False):
    """Logits [len(ids), vocab]. `rope_everywhere` gives SmolLM3's no-rope layers rotary
    embeddings too (to show that leaving them out matters)."""
    a = str(metadata["general.architecture"])
    hidden = metadata[f"{a}.embedding_length"]
    heads = metadata[f"{a}.attention.head_count"]
    kv_heads = metadata[f"{a}.attention.head_count_kv"]
    head_dim = hidden // heads
    eps = metadata[f"{a}.attention.layer_norm_rms_epsilon"]
    base = metadata[f"{a}.rope.freq_base"]
    embedding_scale = metadata.get(f"{a}.embedding_scale", 1.0)
    residual_scale = metadata.get(f"{a}.residual_scale", 1.0)
    attention_scale = metadata.get(f"{a}.attention.scale", head_dim**-0.5)
    logit_scale = metadata.get(f"{a}.logit_scale", 1.0)
    olmo2 = a == "olmo2"
    length = len(ids)

    inverse = 1.0 / base ** (np.arange(0, head_dim, 2) / head_dim)
    angles = np.arange(length)[:, None] * inverse[None]
    angles = np.concatenate([angles, angles], -1)[:, None]

    def rope(x: np.ndarray) -> np.ndarray:
        first, second = x[..., : head_dim // 2], x[..., head_dim // 2 :]
        return (x * np.cos(angles) + np.concatenate([-second, first], -1) * np.sin(angles)).astype(np.float32)

    def silu(x: np.ndarray) -> np.ndarray:
        return x / (1 + np.exp(-x))

    x = weights["token_embd.weight"][np.asarray(ids)] * embedding_scale
    allowed = np.arange(length)[None] <= np.arange(length)[:, None]
    for layer in range(metadata[f"{a}.block_count"]):
        p = f"blk.{layer}."
        h = x if olmo2 else _rms(x, weights[p + "attn_norm.weight"], eps)
        q, k, v = (h @ weights[p + f"attn_{part}.weight"].T for part in "qkv")
        if olmo2:
            q, k = _rms(q, weights[p + "attn_q_norm.weight"], eps), _rms(k, weights[p + "attn_k_norm.weight"], eps)
        q = q.reshape(length, heads, head_dim)
        k = k.reshape(length, kv_heads, head_dim)
        v = v.reshape(length, kv_heads, head_dim)
        # SmolLM3's no_rope_layers: every fourth layer (3, 7, ...) has no rotary embeddings.
        if rope_everywhere or not (a == "smollm3" and (layer + 1) % 4 == 0):
            q, k = rope(q), rope(k)
        context = np.empty((length, heads, head_dim), np.float32)
        for head in range(heads):
            kv = head // (heads // kv_heads)
            scores = np.where(allowed, (q[:, head] @ k[:, kv].T) * attention_scale, -np.inf)
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            context[:, head] = (scores / scores.sum(-1, keepdims=True)) @ v[:, kv]
        out = context.reshape(length, -1) @ weights[p + "attn_output.weight"].T
        if olmo2:
            out = _rms(out, weights[p + "post_attention_norm.weight"], eps)
        x = x + out * residual_scale
        h = x if olmo2 else _rms(x, weights[p + "ffn_norm.weight"], eps)
        out = (silu(h @ weights[p + "ffn_gate.weight"].T) * (h @ weights[p + "ffn_up.weight"].T)) @ weights[
            p + "ffn_down.weight"
        ].T
        if olmo2:
            out = _rms(out, weights[p + "post_ffw_norm.weight"], eps)
        x = x + out * residual_scale
    x = _rms(x, weights["output_norm.weight"], eps)
    return (x @ weights.get("output.weight", weights["token_embd.weight"]).T) / logit_scale
