"""Llama-shaped dense decoders the engine's own GGUF reader does not build: SmolLM3
(`smollm3`), Granite 3 (`granite`) and OLMo 2 (`olmo2`), each a Layout of one decoder.

As transformers' SmolLM3ForCausalLM, GraniteForCausalLM and Olmo2ForCausalLM compute
them: grouped-query attention with rotary embeddings (NeoX order, base
`rope.freq_base`) and a SwiGLU MLP, the output projection its own or tied to the
embeddings. What sets each apart:

- SmolLM3 leaves every fourth layer without rotary embeddings (its `no_rope_layers`,
  which llama.cpp fixes at every fourth: layers 3, 7, 11, ...), RMS norms before
  attention and the MLP.
- Granite scales the embeddings (`embedding_scale`), each layer's attention and MLP
  output before it joins the residual (`residual_scale`), the attention scores
  (`attention.scale` in place of 1/sqrt(head size)) and divides the logits by
  `logit_scale`.
- OLMo 2 norms after attention and the MLP instead of before (`post_attention_norm`,
  `post_ffw_norm`), and RMS-norms the queries and keys across all heads together
  (`attn_q_norm` over heads x head size) before the rotary embeddings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import openvino as ov
import openvino.opset15 as ops

from ovtrio.gguf.builder import graph as g
from ovtrio.gguf.builder.hyper import Hyper
from ovtrio.gguf.builder.tensors import GGUFTensors

# llama.cpp's n_no_rope_layer_step for SmolLM3: layer i has no rotary embeddings when (i + 1) % 4 == 0.
SMOLLM3_NO_ROPE_STEP = 4


@dataclass(frozen=True)
class Layout:
    architecture: str
    no_rope_step: int = 0  # every n-th layer without rotary embeddings (0: none)
    post_norms: bool = False  # norms after attention and the MLP, none before (OLMo 2)
    whole_qk_norms: bool = False  # queries' and keys' RMS norm across all heads (OLMo 2)


SMOLLM3 = Layout("smollm3", no_rope_step=SMOLLM3_NO_ROPE_STEP)
GRANITE = Layout("granite")  # its multipliers are the file's (Hyper), 1 in other files
OLMO2 = Layout("olmo2", post_norms=True, whole_qk_norms=True)
LAYOUTS = {layout.architecture: layout for layout in (SMOLLM3, GRANITE, OLMO2)}


def _scaled(x: ov.Output, factor: float) -> ov.Output:
    return x if factor == 1.0 else ops.multiply(x, g.const(np.float32(factor), np.float32)).output(0)


def builder(layout: Layout) -> Callable[[Hyper, GGUFTensors], ov.Model]:
    return partial(build_dense, layout)


def build_dense(layout: Layout, hyper: Hyper, tensors: GGUFTensors) -> ov.Model:
    graph = g.inputs()
    caches = g.Caches([])
    embeddings = g.matrix(tensors.matrix("token_embd.weight"))
    x = _scaled(ops.gather(embeddings, graph.input_ids, g.const(0)).output(0), hyper.embedding_scale)
    tables = g.rope_tables(graph, g.rope_frequencies(hyper.head_dim, hyper.rope_base) / hyper.rope_scale)
    mask = g.causal_mask(graph)
    scale = hyper.attention_scale or float(hyper.head_dim**-0.5)

    def linear(name: str, h: ov.Output) -> ov.Output:
        return g.linear(h, g.matrix(tensors.matrix(name)))

    for layer in range(hyper.layers):
        name = f"blk.{layer}."
        h = x if layout.post_norms else g.rms_norm(x, tensors.values(name + "attn_norm.weight"), hyper.eps)
        q, k, v = (linear(name + f"attn_{part}.weight", h) for part in "qkv")
        if layout.whole_qk_norms:
            q = g.rms_norm(q, tensors.values(name + "attn_q_norm.weight"), hyper.eps)
            k = g.rms_norm(k, tensors.values(name + "attn_k_norm.weight"), hyper.eps)
        q = g.to_heads_first(g.split_heads(q, hyper.heads, hyper.head_dim))
        k = g.to_heads_first(g.split_heads(k, hyper.kv_heads, hyper.head_dim))
        if not (layout.no_rope_step and (layer + 1) % layout.no_rope_step == 0):
            q = g.apply_rope(q, tables, hyper.head_dim)
            k = g.apply_rope(k, tables, hyper.head_dim)
        v = g.to_heads_first(g.split_heads(v, hyper.kv_heads, hyper.head_dim))
        context = g.attention(graph, caches, layer, q, k, v, mask, scale, hyper.heads, hyper.kv_heads, hyper.head_dim)
        out = linear(name + "attn_output.weight", context)
        if layout.post_norms:
            out = g.rms_norm(out, tensors.values(name + "post_attention_norm.weight"), hyper.eps)
        x = ops.add(x, _scaled(out, hyper.residual_scale)).output(0)

        h = x if layout.post_norms else g.rms_norm(x, tensors.values(name + "ffn_norm.weight"), hyper.eps)
        gate = ops.swish(linear(name + "ffn_gate.weight", h)).output(0)
        out = linear(name + "ffn_down.weight", ops.multiply(gate, linear(name + "ffn_up.weight", h)).output(0))
        if layout.post_norms:
            out = g.rms_norm(out, tensors.values(name + "post_ffw_norm.weight"), hyper.eps)
        x = ops.add(x, _scaled(out, hyper.residual_scale)).output(0)

    x = g.rms_norm(x, tensors.values("output_norm.weight"), hyper.eps)
    head = g.matrix(tensors.matrix("output.weight")) if "output.weight" in tensors else embeddings
    logits = _scaled(g.linear(x, head), 1.0 / hyper.logit_scale)
    return g.model(graph, logits, caches, layout.architecture)
