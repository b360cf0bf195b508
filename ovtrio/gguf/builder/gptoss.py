"""gpt-oss (gpt-oss-20b, gpt-oss-120b), GGUF architecture `gpt-oss`.

As transformers' GptOssForCausalLM computes it: RMS norms before attention and before the
MLP (the file's `post_attention_norm`, transformers' post_attention_layernorm); query,
key, value and output projections with biases; rotary embeddings (NeoX order) with YaRN
scaling (`rope.scaling.factor` over `rope.scaling.original_context_length`, transformers'
`truncate: false`, graph.yarn_frequencies); grouped-query attention whose softmax has one
learned sink logit per head (`attn_sinks`) in its denominator; the even layers attending
to the last `attention.sliding_window` positions (128), the odd ones to all; in place of
a dense MLP `expert_count` experts, `expert_used_count` of them per token, chosen as the
top k of the router's logits (with its bias) and weighted by the softmax of those k, each
expert's projections with biases and its clamped SwiGLU: gate clamped above at 7, up
within ±7, (up + 1) · gate · sigmoid(1.702 · gate); the output projection its own.

llama.cpp computes YaRN's correction range rounded outwards to whole dimensions (the
`truncate: true` of other YaRN models), which moves the blend of a few dimensions' frequencies
slightly; this builder follows the reference.
"""

from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset15 as ops

from ovtrio.gguf.builder import graph as g
from ovtrio.gguf.builder.experts import Routing, routed_experts
from ovtrio.gguf.builder.hyper import Hyper, MissingMetadata
from ovtrio.gguf.builder.tensors import GGUFTensors

ARCHITECTURE = "gpt-oss"
SWIGLU_ALPHA = 1.702  # transformers' swiglu_alpha, fixed in llama.cpp too (no GGUF key)
SWIGLU_LIMIT = 7.0  # swiglu_limit


def is_local(layer: int) -> bool:
    """transformers' layer_types: sliding_attention on the even layers."""
    return layer % 2 == 0


def clamped_swiglu(gate: ov.Output, up: ov.Output) -> ov.Output:
    gate = ops.minimum(gate, g.const(SWIGLU_LIMIT, np.float32)).output(0)
    up = ops.clamp(up, -SWIGLU_LIMIT, SWIGLU_LIMIT).output(0)
    glu = ops.multiply(gate, ops.sigmoid(ops.multiply(gate, g.const(SWIGLU_ALPHA, np.float32))))
    return ops.multiply(ops.add(up, g.const(1.0, np.float32)), glu).output(0)


def rope(hyper: Hyper) -> tuple[np.ndarray, float]:
    """The inverse frequencies and the attention factor of cos and sin."""
    if hyper.rope_scaling == "yarn" and hyper.rope_factor > 1:
        return g.yarn_frequencies(
            hyper.rotary_dim,
            hyper.rope_base,
            hyper.rope_factor,
            hyper.original_context_length or hyper.context_length,
            hyper.yarn_beta_fast,
            hyper.yarn_beta_slow,
        )
    return g.rope_frequencies(hyper.rotary_dim, hyper.rope_base) / np.float32(hyper.rope_scale), 1.0


def build(hyper: Hyper, tensors: GGUFTensors) -> ov.Model:
    if not 0 < hyper.experts_used <= hyper.experts:
        raise MissingMetadata(f"{ARCHITECTURE}.expert_used_count {hyper.experts_used} is not within 1..{hyper.experts}")
    moe = Routing(hyper.experts, hyper.experts_used, normalized=False, softmax_of_chosen=True)
    graph = g.inputs()
    caches = g.Caches([])
    embeddings = g.matrix(tensors.matrix("token_embd.weight"))
    x = ops.gather(embeddings, graph.input_ids, g.const(0)).output(0)
    frequencies, attention_factor = rope(hyper)
    tables = g.rope_tables(graph, frequencies, attention_factor)
    full_mask = g.causal_mask(graph)
    window_mask = g.sliding_mask(graph, hyper.sliding_window) if hyper.sliding_window else full_mask
    scale = float(hyper.head_dim**-0.5)

    def projection(name: str, h: ov.Output) -> ov.Output:
        bias = tensors.values(name + ".bias") if name + ".bias" in tensors else None
        return g.linear(h, g.matrix(tensors.matrix(name + ".weight")), bias)

    for layer in range(hyper.layers):
        name = f"blk.{layer}."
        h = g.rms_norm(x, tensors.values(name + "attn_norm.weight"), hyper.eps)
        q = g.to_heads_first(g.split_heads(projection(name + "attn_q", h), hyper.heads, hyper.head_dim))
        k = g.to_heads_first(g.split_heads(projection(name + "attn_k", h), hyper.kv_heads, hyper.head_dim))
        v = g.to_heads_first(g.split_heads(projection(name + "attn_v", h), hyper.kv_heads, hyper.head_dim))
        q = g.apply_rope(q, tables, hyper.head_dim, hyper.rotary_dim)
        k = g.apply_rope(k, tables, hyper.head_dim, hyper.rotary_dim)
        sinks = tensors.values(name + "attn_sinks.weight")
        if sinks.size != hyper.heads:
            raise ValueError(
                f"{name}attn_sinks.weight has {sinks.size} values, not one for each of {hyper.heads} heads"
            )
        context = g.attention(
            graph,
            caches,
            layer,
            q,
            k,
            v,
            window_mask if is_local(layer) else full_mask,
            scale,
            hyper.heads,
            hyper.kv_heads,
            hyper.head_dim,
            sinks,
        )
        x = ops.add(x, projection(name + "attn_output", context)).output(0)
        h = g.rms_norm(x, tensors.values(name + "post_attention_norm.weight"), hyper.eps)
        x = ops.add(x, routed_experts(h, hyper.hidden, moe, tensors, name, clamped_swiglu)).output(0)

    x = g.rms_norm(x, tensors.values("output_norm.weight"), hyper.eps)
    head = g.matrix(tensors.matrix("output.weight")) if "output.weight" in tensors else embeddings
    return g.model(graph, g.linear(x, head), caches, ARCHITECTURE)
