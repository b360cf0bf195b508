"""Gemma 3 (text), GGUF architecture `gemma3`, and the decoder it shares with Gemma 2.

As transformers' Gemma3ForCausalLM computes it: embeddings scaled by sqrt(hidden size);
per layer RMS norms before and after attention and the MLP, RMS norms of each head's
query and key, rotary embeddings with base `rope.freq_base` on global layers and 10,000
on local ones, local layers (five of every six, the sixth global) attending to the last
`attention.sliding_window` positions, a GeGLU MLP (tanh approximation); the output
projection tied to the embeddings unless the file has its own. llama.cpp's conversion
writes the norms' weights with Gemma's +1 already added, so they are used as they are.
The attention scale is 1/sqrt(head size), except for the 27B model, whose
query_pre_attn_scalar is hidden size / heads (as llama.cpp takes it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import openvino as ov
import openvino.opset15 as ops

from ovtrio.gguf.builder import graph as g
from ovtrio.gguf.builder.hyper import Hyper
from ovtrio.gguf.builder.tensors import GGUFTensors

ARCHITECTURE = "gemma3"
LOCAL_ROPE_BASE = 10_000.0
GLOBAL_EVERY = 6  # layers 5, 11, 17, ... attend globally


def is_local(layer: int) -> bool:
    return (layer + 1) % GLOBAL_EVERY != 0


def attention_scale(hyper: Hyper) -> float:
    if hyper.layers == 62 and hyper.hidden == 5376:  # Gemma 3 27B: query_pre_attn_scalar = hidden / heads
        return float((hyper.hidden / hyper.heads) ** -0.5)
    return float(hyper.head_dim**-0.5)


@dataclass(frozen=True)
class Layout:
    """What differs between the Gemma generations that share this decoder."""

    architecture: str
    is_local: Callable[[int], bool]  # whether a layer attends to the sliding window only
    local_rope_base: float | None  # the local layers' own rope base (None: the file's)
    head_norms: bool  # RMS norms of each head's query and key
    attention_scale: Callable[[Hyper], float]


GEMMA3 = Layout(ARCHITECTURE, is_local, LOCAL_ROPE_BASE, True, attention_scale)


def build(hyper: Hyper, tensors: GGUFTensors) -> ov.Model:
    return build_gemma(GEMMA3, hyper, tensors)


def build_gemma(layout: Layout, hyper: Hyper, tensors: GGUFTensors) -> ov.Model:
    graph = g.inputs()
    caches = g.Caches([])
    embeddings = g.matrix(tensors.matrix("token_embd.weight"))
    x = ops.gather(embeddings, graph.input_ids, g.const(0))
    x = ops.multiply(x, g.const(np.float32(np.sqrt(hyper.hidden)), np.float32)).output(0)

    global_frequencies = g.rope_frequencies(hyper.head_dim, hyper.rope_base) / np.float32(hyper.rope_scale)
    global_tables = g.rope_tables(graph, global_frequencies)
    local_tables = (
        g.rope_tables(graph, g.rope_frequencies(hyper.head_dim, layout.local_rope_base))
        if layout.local_rope_base is not None
        else global_tables
    )
    full_mask = g.causal_mask(graph)
    window_mask = g.sliding_mask(graph, hyper.sliding_window) if hyper.sliding_window else full_mask
    scale = layout.attention_scale(hyper)

    for layer in range(hyper.layers):
        name = f"blk.{layer}."
        local = layout.is_local(layer) and hyper.sliding_window > 0
        h = g.rms_norm(x, tensors.values(name + "attn_norm.weight"), hyper.eps)
        q = g.split_heads(g.linear(h, g.matrix(tensors.matrix(name + "attn_q.weight"))), hyper.heads, hyper.head_dim)
        k = g.split_heads(g.linear(h, g.matrix(tensors.matrix(name + "attn_k.weight"))), hyper.kv_heads, hyper.head_dim)
        v = g.split_heads(g.linear(h, g.matrix(tensors.matrix(name + "attn_v.weight"))), hyper.kv_heads, hyper.head_dim)
        if layout.head_norms:
            q = g.rms_norm(q, tensors.values(name + "attn_q_norm.weight"), hyper.eps)
            k = g.rms_norm(k, tensors.values(name + "attn_k_norm.weight"), hyper.eps)
        tables = local_tables if local else global_tables
        q = g.apply_rope(g.to_heads_first(q), tables, hyper.head_dim)
        k = g.apply_rope(g.to_heads_first(k), tables, hyper.head_dim)
        context = g.attention(
            graph,
            caches,
            layer,
            q,
            k,
            g.to_heads_first(v),
            window_mask if local else full_mask,
            scale,
            hyper.heads,
            hyper.kv_heads,
            hyper.head_dim,
        )
        out = g.linear(context, g.matrix(tensors.matrix(name + "attn_output.weight")))
        x = ops.add(x, g.rms_norm(out, tensors.values(name + "post_attention_norm.weight"), hyper.eps)).output(0)
        h = g.rms_norm(x, tensors.values(name + "ffn_norm.weight"), hyper.eps)
        gate = ops.gelu(g.linear(h, g.matrix(tensors.matrix(name + "ffn_gate.weight"))), "tanh")
        up = g.linear(h, g.matrix(tensors.matrix(name + "ffn_up.weight")))
        down = g.linear(ops.multiply(gate, up).output(0), g.matrix(tensors.matrix(name + "ffn_down.weight")))
        x = ops.add(x, g.rms_norm(down, tensors.values(name + "post_ffw_norm.weight"), hyper.eps)).output(0)

    x = g.rms_norm(x, tensors.values("output_norm.weight"), hyper.eps)
    head = g.matrix(tensors.matrix("output.weight")) if "output.weight" in tensors else embeddings
    logits = g.linear(x, head)
    if hyper.final_softcap:
        cap = g.const(hyper.final_softcap, np.float32)
        logits = ops.multiply(ops.tanh(ops.divide(logits, cap)), cap).output(0)
    return g.model(graph, logits, caches, layout.architecture)
