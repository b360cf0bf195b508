"""Phi-3, Phi-3.5 and Phi-4-mini, GGUF architecture `phi3`.

As transformers' Phi3ForCausalLM computes it: RMS norms before attention and the MLP; one
fused query-key-value projection (`attn_qkv`, rows: the queries, then the keys, then the
values) or, in older files, three; rotary embeddings (NeoX order) over the first
`rope.dimension_count` dimensions of each head (Phi-4-mini turns three quarters of them);
a SwiGLU MLP whose `ffn_up` holds the gate's rows and then the up projection's; the output
projection tied to the embeddings unless the file has its own (Phi-4-mini ties them).

LongRoPE (Phi-3.5-mini, Phi-4-mini, Phi-3-*-128k): the file carries `rope_factors_long`
and `rope_factors_short`, and each inverse frequency is divided by its factor. transformers
and llama.cpp take the long factors once the context is past
`rope.scaling.original_context_length`; ovtrio serves the model's full context, so a file
whose `context_length` is above the original gets the long factors for every position
(as llama-server does when its context is set to the model's), with cos and sin scaled by
sqrt(1 + ln(context / original) / ln(original)); the short factors are then unused.

The sliding window of Phi-3-mini-4k (`attention.sliding_window`, 2047) is kept as
transformers applies it, on every layer; a window not below the context length (Phi-3.5,
Phi-4-mini: 262144) changes nothing and is left out.
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import openvino as ov
import openvino.opset15 as ops

from ovtrio.gguf.builder import graph as g
from ovtrio.gguf.builder.hyper import Hyper
from ovtrio.gguf.builder.tensors import GGUFTensors

ARCHITECTURE = "phi3"


def window(hyper: Hyper) -> int:
    """The window attention keeps (0: none)."""
    return hyper.sliding_window if 0 < hyper.sliding_window < hyper.context_length else 0


def rope(hyper: Hyper, tensors: GGUFTensors) -> tuple[np.ndarray, float]:
    """The inverse frequencies of the rotated dimensions and the attention factor."""
    long_context = 0 < hyper.original_context_length < hyper.context_length
    name = "rope_factors_long.weight" if long_context else "rope_factors_short.weight"
    if name in tensors:
        return g.longrope_frequencies(
            hyper.rotary_dim,
            hyper.rope_base,
            tensors.values(name),
            hyper.context_length,
            hyper.original_context_length or hyper.context_length,
        )
    return g.rope_frequencies(hyper.rotary_dim, hyper.rope_base) / np.float32(hyper.rope_scale), 1.0


def _projections(hyper: Hyper, tensors: GGUFTensors, name: str, h: ov.Output) -> tuple[ov.Output, ov.Output, ov.Output]:
    queries, keys = hyper.heads * hyper.head_dim, hyper.kv_heads * hyper.head_dim
    if name + "attn_qkv.weight" not in tensors:
        return tuple(g.linear(h, g.matrix(tensors.matrix(name + f"attn_{part}.weight"))) for part in "qkv")
    fused = g.linear(h, g.matrix(tensors.matrix(name + "attn_qkv.weight")))
    bounds = (0, queries, queries + keys, queries + 2 * keys)
    return tuple(
        ops.slice(fused, g.const([start]), g.const([stop]), g.const([1]), g.const([2])).output(0)
        for start, stop in pairwise(bounds)
    )


def build(hyper: Hyper, tensors: GGUFTensors) -> ov.Model:
    graph = g.inputs()
    caches = g.Caches([])
    embeddings = g.matrix(tensors.matrix("token_embd.weight"))
    x = ops.gather(embeddings, graph.input_ids, g.const(0)).output(0)
    frequencies, attention_factor = rope(hyper, tensors)
    tables = g.rope_tables(graph, frequencies, attention_factor)
    mask = g.sliding_mask(graph, window(hyper)) if window(hyper) else g.causal_mask(graph)
    scale = float(hyper.head_dim**-0.5)
    half = hyper.feed_forward

    for layer in range(hyper.layers):
        name = f"blk.{layer}."
        h = g.rms_norm(x, tensors.values(name + "attn_norm.weight"), hyper.eps)
        q, k, v = _projections(hyper, tensors, name, h)
        q = g.apply_rope(
            g.to_heads_first(g.split_heads(q, hyper.heads, hyper.head_dim)), tables, hyper.head_dim, hyper.rotary_dim
        )
        k = g.apply_rope(
            g.to_heads_first(g.split_heads(k, hyper.kv_heads, hyper.head_dim)), tables, hyper.head_dim, hyper.rotary_dim
        )
        v = g.to_heads_first(g.split_heads(v, hyper.kv_heads, hyper.head_dim))
        context = g.attention(graph, caches, layer, q, k, v, mask, scale, hyper.heads, hyper.kv_heads, hyper.head_dim)
        x = ops.add(x, g.linear(context, g.matrix(tensors.matrix(name + "attn_output.weight")))).output(0)
        h = g.rms_norm(x, tensors.values(name + "ffn_norm.weight"), hyper.eps)
        if name + "ffn_gate.weight" in tensors:
            gate = g.linear(h, g.matrix(tensors.matrix(name + "ffn_gate.weight")))
            up = g.linear(h, g.matrix(tensors.matrix(name + "ffn_up.weight")))
        else:
            fused = g.linear(h, g.matrix(tensors.matrix(name + "ffn_up.weight")))
            gate = ops.slice(fused, g.const([0]), g.const([half]), g.const([1]), g.const([2])).output(0)
            up = ops.slice(fused, g.const([half]), g.const([2 * half]), g.const([1]), g.const([2])).output(0)
        down = g.linear(ops.multiply(ops.swish(gate), up).output(0), g.matrix(tensors.matrix(name + "ffn_down.weight")))
        x = ops.add(x, down).output(0)

    x = g.rms_norm(x, tensors.values("output_norm.weight"), hyper.eps)
    head = g.matrix(tensors.matrix("output.weight")) if "output.weight" in tensors else embeddings
    return g.model(graph, g.linear(x, head), caches, ARCHITECTURE)
