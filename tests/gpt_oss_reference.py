"""gpt-oss's forward pass in numpy, written from transformers' GptOssForCausalLM (its eager
attention with sinks, GptOssTopKRouter, GptOssExperts and YaRN's _compute_yarn_parameters
with truncate false; the reference the graph builder is checked against, sharing no code
with ovtrio): each token's experts chosen one token at a time. Weights are a GGUF file's,
dequantized by the gguf package."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gemma3_reference import read_gguf

__all__ = ["forward", "read_gguf"]


def _rms(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    mean = (x.astype(np.float64) ** 2).mean(-1, keepdims=True)
    return (x / np.sqrt(mean + eps)).astype(np.float32) * weight


def _yarn(dim: int, base: float, factor: float, original: int, truncate: bool) -> tuple[np.ndarray, float]:
    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(32.0), correction_dim(1.0)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    inv_freq = (1 / (factor * pos_freqs)) * (1 - extrapolation) + (1 / pos_freqs) * extrapolation
    return inv_freq, 0.1 * math.log(factor) + 1.0


def forward(
    metadata: dict[str, Any],
    weights: dict[str, np.ndarray],
    ids: list[int],
    sinks: bool = True,
    clamp: bool = True,
    window: bool = True,
    truncate: bool = False,
) -> np.ndarray:
    """Logits [len(ids), vocab]. `sinks`, `clamp` and `window` False leave out the
    attention's sinks, the SwiGLU's clamp or the sliding window (to show each matters);
    `truncate` rounds YaRN's correction range to whole dimensions, as llama.cpp does (gpt-oss's
    config turns that off)."""
    a = str(metadata["general.architecture"])
    heads = metadata[f"{a}.attention.head_count"]
    kv_heads = metadata[f"{a}.attention.head_count_kv"]
    head_dim = metadata[f"{a}.attention.key_length"]
    eps = metadata[f"{a}.attention.layer_norm_rms_epsilon"]
    top_k = metadata[f"{a}.expert_used_count"]
    sliding = metadata[f"{a}.attention.sliding_window"]
    alpha, limit = 1.702, 7.0
    length = len(ids)

    inverse, scaling = _yarn(
        head_dim,
        metadata[f"{a}.rope.freq_base"],
        metadata[f"{a}.rope.scaling.factor"],
        metadata[f"{a}.rope.scaling.original_context_length"],
        truncate,
    )
    angles = np.arange(length)[:, None] * inverse[None]
    cos, sin = (np.cos(angles) * scaling)[:, None], (np.sin(angles) * scaling)[:, None]

    def rope(x: np.ndarray) -> np.ndarray:  # transformers' _apply_rotary_emb: halves
        first, second = x[..., : head_dim // 2], x[..., head_dim // 2 :]
        return np.concatenate([first * cos - second * sin, second * cos + first * sin], -1).astype(np.float32)

    def project(name: str, h: np.ndarray) -> np.ndarray:
        return h @ weights[name + ".weight"].T + weights[name + ".bias"]

    x = weights["token_embd.weight"][np.asarray(ids)]
    queries, keys = np.arange(length)[:, None], np.arange(length)[None]
    causal = keys <= queries
    for layer in range(metadata[f"{a}.block_count"]):
        p = f"blk.{layer}."
        allowed = causal & (queries - keys < sliding) if window and layer % 2 == 0 else causal
        h = _rms(x, weights[p + "attn_norm.weight"], eps)
        q = rope(project(p + "attn_q", h).reshape(length, heads, head_dim))
        k = rope(project(p + "attn_k", h).reshape(length, kv_heads, head_dim))
        v = project(p + "attn_v", h).reshape(length, kv_heads, head_dim)
        context = np.empty((length, heads, head_dim), np.float32)
        for head in range(heads):
            kv = head // (heads // kv_heads)
            scores = np.where(allowed, (q[:, head] @ k[:, kv].T) * head_dim**-0.5, -np.inf)
            sink = np.full((length, 1), weights[p + "attn_sinks.weight"][head] if sinks else -np.inf)
            combined = np.concatenate([scores, sink], -1)
            combined = np.exp(combined - combined.max(-1, keepdims=True))
            probabilities = combined / combined.sum(-1, keepdims=True)
            context[:, head] = probabilities[:, :-1] @ v[:, kv]
        x = x + project(p + "attn_output", context.reshape(length, -1))
        h = _rms(x, weights[p + "post_attention_norm.weight"], eps)
        router = project(p + "ffn_gate_inp", h)
        if p + "ffn_gate_up_exps.weight" in weights:  # llama.cpp's --fuse-gate-up-exps: gate rows, then up rows
            both, both_bias = weights[p + "ffn_gate_up_exps.weight"], weights[p + "ffn_gate_up_exps.bias"]
            rows = both.shape[1] // 2
            gate_weight, up_weight, gate_bias, up_bias = (
                both[:, :rows],
                both[:, rows:],
                both_bias[:, :rows],
                both_bias[:, rows:],
            )
        else:
            gate_weight, gate_bias = weights[p + "ffn_gate_exps.weight"], weights[p + "ffn_gate_exps.bias"]
            up_weight, up_bias = weights[p + "ffn_up_exps.weight"], weights[p + "ffn_up_exps.bias"]
        out = np.zeros_like(h)
        for token in range(length):
            chosen = np.argsort(-router[token], kind="stable")[:top_k]
            routing = np.exp(router[token, chosen] - router[token, chosen].max())
            routing /= routing.sum()
            for expert, weight in zip(chosen, routing, strict=True):
                gate = h[token] @ gate_weight[expert].T + gate_bias[expert]
                up = h[token] @ up_weight[expert].T + up_bias[expert]
                if clamp:
                    gate, up = np.minimum(gate, limit), np.clip(up, -limit, limit)
                glu = gate / (1 + np.exp(-gate * alpha))
                down = ((up + 1) * glu) @ weights[p + "ffn_down_exps.weight"][expert].T
                out[token] += weight * (down + weights[p + "ffn_down_exps.bias"][expert])
        x = x + out
    x = _rms(x, weights["output_norm.weight"], eps)
    return x @ weights["output.weight"].T
