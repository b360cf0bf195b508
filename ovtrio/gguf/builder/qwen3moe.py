"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B), GGUF architecture
`qwen3moe`, and the decoder it shares with Qwen2-MoE (qwen2moe.py).

As transformers' Qwen3MoeForCausalLM computes it: RMS norms before attention and the
MLP; queries and keys of `attention.key_length` per head (128 in Qwen3-30B-A3B, not
hidden / heads), each RMS-normed per head, then rotary embeddings (NeoX order, base
`rope.freq_base`); grouped-query attention; in place of the dense MLP a mixture of
`expert_count` SwiGLU experts, `expert_used_count` of them per token, chosen by the
router's softmax and weighted by it renormalized over the chosen ones (experts.py); the
output projection its own, or tied to the embeddings when the file has none.
"""

from __future__ import annotations

from dataclasses import dataclass

import openvino as ov
import openvino.opset15 as ops

from ovtrio.gguf.builder import graph as g
from ovtrio.gguf.builder.experts import Routing, routed_experts, shared_expert
from ovtrio.gguf.builder.hyper import Hyper, MissingMetadata
from ovtrio.gguf.builder.tensors import GGUFTensors

ARCHITECTURE = "qwen3moe"


@dataclass(frozen=True)
class Layout:
    """What differs between the Qwen MoE generations that share this decoder."""

    architecture: str
    head_norms: bool  # RMS norms of each head's query and key (Qwen3)
    normalized_routing: bool  # the chosen experts' weights renormalized (Qwen3: norm_topk_prob)


QWEN3MOE = Layout(ARCHITECTURE, head_norms=True, normalized_routing=True)


def routing(hyper: Hyper, metadata_routing: tuple[int, int], layout: Layout) -> Routing:
    experts, chosen = metadata_routing
    if not 0 < chosen <= experts:
        raise MissingMetadata(f"{layout.architecture}.expert_used_count {chosen} is not within 1..{experts}")
    return Routing(experts, chosen, layout.normalized_routing)


def build(hyper: Hyper, tensors: GGUFTensors) -> ov.Model:
    return build_qwen_moe(QWEN3MOE, hyper, tensors)


def build_qwen_moe(layout: Layout, hyper: Hyper, tensors: GGUFTensors) -> ov.Model:
    if not hyper.experts:
        raise MissingMetadata(f"the file has no '{layout.architecture}.expert_count'")
    moe = routing(hyper, (hyper.experts, hyper.experts_used), layout)
    graph = g.inputs()
    caches = g.Caches([])
    embeddings = g.matrix(tensors.matrix("token_embd.weight"))
    x = ops.gather(embeddings, graph.input_ids, g.const(0)).output(0)
    tables = g.rope_tables(graph, g.rope_frequencies(hyper.head_dim, hyper.rope_base) / hyper.rope_scale)
    mask = g.causal_mask(graph)
    scale = float(hyper.head_dim**-0.5)

    def projection(name: str, h: ov.Output) -> ov.Output:
        bias = tensors.values(name.replace(".weight", ".bias")) if name.replace(".weight", ".bias") in tensors else None
        return g.linear(h, g.matrix(tensors.matrix(name)), bias)

    for layer in range(hyper.layers):
        name = f"blk.{layer}."
        h = g.rms_norm(x, tensors.values(name + "attn_norm.weight"), hyper.eps)
        q = g.split_heads(projection(name + "attn_q.weight", h), hyper.heads, hyper.head_dim)
        k = g.split_heads(projection(name + "attn_k.weight", h), hyper.kv_heads, hyper.head_dim)
        v = g.split_heads(projection(name + "attn_v.weight", h), hyper.kv_heads, hyper.head_dim)
        if layout.head_norms:
            q = g.rms_norm(q, tensors.values(name + "attn_q_norm.weight"), hyper.eps)
            k = g.rms_norm(k, tensors.values(name + "attn_k_norm.weight"), hyper.eps)
        q = g.apply_rope(g.to_heads_first(q), tables, hyper.head_dim)
        k = g.apply_rope(g.to_heads_first(k), tables, hyper.head_dim)
        context = g.attention(
            graph, caches, layer, q, k, g.to_heads_first(v), mask, scale, hyper.heads, hyper.kv_heads, hyper.head_dim
        )
        x = ops.add(x, g.linear(context, g.matrix(tensors.matrix(name + "attn_output.weight")))).output(0)
        h = g.rms_norm(x, tensors.values(name + "ffn_norm.weight"), hyper.eps)
        out = routed_experts(h, hyper.hidden, moe, tensors, name)
        if name + "ffn_gate_shexp.weight" in tensors:
            out = ops.add(out, shared_expert(h, tensors, name)).output(0)
        x = ops.add(x, out).output(0)

    x = g.rms_norm(x, tensors.values("output_norm.weight"), hyper.eps)
    head = g.matrix(tensors.matrix("output.weight")) if "output.weight" in tensors else embeddings
    return g.model(graph, g.linear(x, head), caches, layout.architecture)
