"""SmolLM3's, Granite's, OLMo 2's and Ministral 3's forward pass in numpy, written from
transformers' SmolLM3ForCausalLM, GraniteForCausalLM, Olmo2ForCausalLM and
Ministral3ForCausalLM (its YaRN from _compute_yarn_parameters, its llama_4 query scaling)
(the reference the graph builder is checked against; it shares no code with ovtrio).
Weights are a GGUF file's, dequantized by the gguf package. The rotation is taken as
llama.cpp takes each architecture's file: SmolLM3's, Granite's and Ministral 3's query
and key rows were reordered by its conversion, and it turns adjacent pairs of them
(ggml's "normal" rope, equal to transformers' rotation of the original rows); OLMo 2's
are transformers' own, turned as halves (NeoX)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gemma3_reference import read_gguf

__all__ = ["forward", "read_gguf"]


def _rms(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    mean = (x.astype(np.float64) ** 2).mean(-1, keepdims=True)
    return (x / np.sqrt(mean + eps)).astype(np.float32) * weight


# Architectures whose query and key rows llama.cpp's conversion (its LlamaModel) reordered.
PERMUTED = frozenset({"smollm3", "granite", "mistral3"})


def _yarn(dim: int, base: float, factor: float, original: int, beta_fast: float, beta_slow: float) -> np.ndarray:
    """transformers' _compute_yarn_parameters with truncate left on (its default)."""

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = max(math.floor(correction_dim(beta_fast)), 0), min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    return (1 / (factor * pos_freqs)) * (1 - extrapolation) + (1 / pos_freqs) * extrapolation


def forward(
    metadata: dict[str, Any],
    weights: dict[str, np.ndarray],
    ids: list[int],
    rope_everywhere: bool = False,
    halves: bool = False,
    temperature: bool = True,
):
    """Logits [len(ids), vocab]. `rope_everywhere` gives SmolLM3's no-rope layers rotary
    embeddings too, `halves` turns a reordered file's rows as halves (as if they were not
    reordered), `temperature` False leaves Ministral 3's query scaling out (to show that
    each matters)."""
    a = str(metadata["general.architecture"])
    hidden = metadata[f"{a}.embedding_length"]
    heads = metadata[f"{a}.attention.head_count"]
    kv_heads = metadata[f"{a}.attention.head_count_kv"]
    head_dim = metadata.get(f"{a}.attention.key_length", hidden // heads)
    eps = metadata[f"{a}.attention.layer_norm_rms_epsilon"]
    base = metadata[f"{a}.rope.freq_base"]
    embedding_scale = metadata.get(f"{a}.embedding_scale", 1.0)
    residual_scale = metadata.get(f"{a}.residual_scale", 1.0)
    attention_scale = metadata.get(f"{a}.attention.scale", head_dim**-0.5)
    logit_scale = metadata.get(f"{a}.logit_scale", 1.0)
    olmo2 = a == "olmo2"
    length = len(ids)

    if metadata.get(f"{a}.rope.scaling.type") == "yarn":
        # Ministral 3: mscale and mscale_all_dim are both 1, so cos and sin are not scaled.
        original = metadata[f"{a}.rope.scaling.original_context_length"]
        inverse = _yarn(
            head_dim,
            base,
            metadata[f"{a}.rope.scaling.factor"],
            original,
            metadata.get(f"{a}.rope.scaling.yarn_beta_fast", 32.0),
            metadata.get(f"{a}.rope.scaling.yarn_beta_slow", 1.0),
        )
    else:
        inverse = 1.0 / base ** (np.arange(0, head_dim, 2) / head_dim)
    angles = np.arange(length)[:, None] * inverse[None]  # [positions, head_dim / 2]
    cos, sin = np.cos(angles)[:, None], np.sin(angles)[:, None]
    pairs = a in PERMUTED and not halves
    beta = metadata.get(f"{a}.attention.temperature_scale", 0.0) if temperature else 0.0
    # transformers' get_llama_4_attn_scale over the original context (1 within it).
    if beta:
        steps = np.floor(np.arange(length) / metadata[f"{a}.rope.scaling.original_context_length"])
        query_scale = (1 + beta * np.log(1 + steps))[:, None, None]
    else:
        query_scale = np.ones((length, 1, 1))

    def rope(x: np.ndarray) -> np.ndarray:
        if pairs:  # ggml's normal rope: (x[2i], x[2i + 1]) turned by angle i
            even, odd = x[..., 0::2], x[..., 1::2]
            turned = np.stack([even * cos - odd * sin, even * sin + odd * cos], -1)
            return turned.reshape(x.shape).astype(np.float32)
        first, second = x[..., : head_dim // 2], x[..., head_dim // 2 :]
        return np.concatenate([first * cos - second * sin, second * cos + first * sin], -1).astype(np.float32)

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
        q = (q * query_scale).astype(np.float32)
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
