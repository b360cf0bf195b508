"""Qwen3-MoE's and Qwen2-MoE's forward pass in numpy, written from transformers'
Qwen3MoeForCausalLM and Qwen2MoeForCausalLM (the reference the graph builder is checked
against; it shares no code with ovtrio): each token's experts chosen one token at a time,
as the sparse block loops over them. Weights are a GGUF file's, dequantized by the gguf
package."""

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


def _swiglu(x: np.ndarray, gate: np.ndarray, up: np.ndarray, down: np.ndarray) -> np.ndarray:
    return (_silu(x @ gate.T) * (x @ up.T)) @ down.T


def forward(
    metadata: dict[str, Any], weights: dict[str, np.ndarray], ids: list[int], chosen: int | None = None
) -> np.ndarray:
    """Logits [len(ids), vocab]; `chosen` overrides the experts each token goes through
    (to show that the routing matters)."""
    a = str(metadata["general.architecture"])
    qwen3 = a == "qwen3moe"
    hidden = metadata[f"{a}.embedding_length"]
    heads = metadata[f"{a}.attention.head_count"]
    kv_heads = metadata[f"{a}.attention.head_count_kv"]
    head_dim = metadata.get(f"{a}.attention.key_length", hidden // heads)
    eps = metadata[f"{a}.attention.layer_norm_rms_epsilon"]
    base = metadata[f"{a}.rope.freq_base"]
    top_k = chosen or metadata[f"{a}.expert_used_count"]
    length = len(ids)

    inverse = 1.0 / base ** (np.arange(0, head_dim, 2) / head_dim)
    angles = np.arange(length)[:, None] * inverse[None]
    angles = np.concatenate([angles, angles], -1)[:, None]

    def rope(x: np.ndarray) -> np.ndarray:
        first, second = x[..., : head_dim // 2], x[..., head_dim // 2 :]
        return (x * np.cos(angles) + np.concatenate([-second, first], -1) * np.sin(angles)).astype(np.float32)

    def project(p: str, h: np.ndarray) -> np.ndarray:
        out = h @ weights[p + ".weight"].T
        return out + weights[p + ".bias"] if p + ".bias" in weights else out

    x = weights["token_embd.weight"][np.asarray(ids)]
    allowed = np.arange(length)[None] <= np.arange(length)[:, None]
    for layer in range(metadata[f"{a}.block_count"]):
        p = f"blk.{layer}."
        h = _rms(x, weights[p + "attn_norm.weight"], eps)
        q = project(p + "attn_q", h).reshape(length, heads, head_dim)
        k = project(p + "attn_k", h).reshape(length, kv_heads, head_dim)
        v = project(p + "attn_v", h).reshape(length, kv_heads, head_dim)
        if qwen3:
            q, k = _rms(q, weights[p + "attn_q_norm.weight"], eps), _rms(k, weights[p + "attn_k_norm.weight"], eps)
        q, k = rope(q), rope(k)
        context = np.empty((length, heads, head_dim), np.float32)
        for head in range(heads):
            kv = head // (heads // kv_heads)
            scores = np.where(allowed, (q[:, head] @ k[:, kv].T) * head_dim**-0.5, -np.inf)
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            context[:, head] = (scores / scores.sum(-1, keepdims=True)) @ v[:, kv]
        x = x + context.reshape(length, -1) @ weights[p + "attn_output.weight"].T
        h = _rms(x, weights[p + "ffn_norm.weight"], eps)
        logits = h @ weights[p + "ffn_gate_inp.weight"].T
        probabilities = np.exp(logits - logits.max(-1, keepdims=True))
        probabilities /= probabilities.sum(-1, keepdims=True)
        out = np.zeros_like(h)
        for token in range(length):
            experts = np.argsort(-probabilities[token])[:top_k]
            routing = probabilities[token, experts]
            if qwen3:  # norm_topk_prob
                routing = routing / routing.sum()
            for expert, weight in zip(experts, routing, strict=True):
                out[token] += weight * _swiglu(
                    h[token],
                    weights[p + "ffn_gate_exps.weight"][expert],
                    weights[p + "ffn_up_exps.weight"][expert],
                    weights[p + "ffn_down_exps.weight"][expert],
                )
        if p + "ffn_gate_shexp.weight" in weights:
            gate = 1 / (1 + np.exp(-(h @ weights[p + "ffn_gate_inp_shexp.weight"].reshape(-1, 1))))
            shared = _swiglu(
                h,
                weights[p + "ffn_gate_shexp.weight"],
                weights[p + "ffn_up_shexp.weight"],
                weights[p + "ffn_down_shexp.weight"],
            )
            out = out + gate * shared
        x = x + out
    x = _rms(x, weights["output_norm.weight"], eps)
    return x @ weights.get("output.weight", weights["token_embd.weight"]).T
