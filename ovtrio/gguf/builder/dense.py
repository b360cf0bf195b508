"""Llama-shaped dense decoders the engine's own GGUF reader does not build: SmolLM3
(`smollm3`), Granite 3 (`granite`), OLMo 2 (`olmo2`) and Ministral 3 (`mistral3`), each a
Layout of one decoder.

As transformers' SmolLM3ForCausalLM, GraniteForCausalLM, Olmo2ForCausalLM and
Ministral3ForCausalLM compute them: grouped-query attention with rotary embeddings (NeoX
order, base `rope.freq_base`) and a SwiGLU MLP, the output projection its own or tied to
the embeddings. llama.cpp's conversion of SmolLM3, Granite and Ministral 3 (its
LlamaModel) reorders each head's query and key rows for its interleaved rotary embedding
(the first half's rows and the second half's taken in turn); those rows are put back in
transformers' order here, codes and all, so the rotation is NeoX's on both. What sets
each apart:

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
- Ministral 3 has a head size of its own (`attention.key_length`), YaRN rope scaling
  with the correction range rounded to whole dimensions and no magnitude factor (its
  mscale and mscale_all_dim are both 1, as llama.cpp cancels it), and scales the queries
  after the rotary embeddings by 1 + `attention.temperature_scale` · ln(1 + floor(position
  / `rope.scaling.original_context_length`)) (transformers' llama_4_scaling_beta, 1 within
  the original context).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import openvino as ov
import openvino.opset15 as ops

from ovtrio.gguf.builder import graph as g
from ovtrio.gguf.builder.hyper import Hyper
from ovtrio.gguf.builder.tensors import GGUFTensors
from ovtrio.gguf.builder.weights import Codes

# llama.cpp's n_no_rope_layer_step for SmolLM3: layer i has no rotary embeddings when (i + 1) % 4 == 0.
SMOLLM3_NO_ROPE_STEP = 4


@dataclass(frozen=True)
class Layout:
    architecture: str
    no_rope_step: int = 0  # every n-th layer without rotary embeddings (0: none)
    post_norms: bool = False  # norms after attention and the MLP, none before (OLMo 2)
    whole_qk_norms: bool = False  # queries' and keys' RMS norm across all heads (OLMo 2)
    permuted_qk: bool = False  # query and key rows in llama.cpp's interleaved-rope order
    yarn: bool = False  # YaRN from `rope.scaling.*` where the file says so (Ministral 3)
    query_temperature: bool = False  # queries scaled by position past the original context


SMOLLM3 = Layout("smollm3", no_rope_step=SMOLLM3_NO_ROPE_STEP, permuted_qk=True)
GRANITE = Layout("granite", permuted_qk=True)  # its multipliers are the file's (Hyper), 1 in other files
OLMO2 = Layout("olmo2", post_norms=True, whole_qk_norms=True)
MISTRAL3 = Layout("mistral3", permuted_qk=True, yarn=True, query_temperature=True)
LAYOUTS = {layout.architecture: layout for layout in (SMOLLM3, GRANITE, OLMO2, MISTRAL3)}


def transformers_order(weight: Codes | np.ndarray, heads: int) -> Codes | np.ndarray:
    """A query or key projection's rows (or bias) as transformers orders them, from the
    order llama.cpp's conversion wrote: within each head, its rows 2j and 2j + 1 are
    transformers' rows j and half + j."""
    rows = weight.codes.shape[0] if isinstance(weight, Codes) else weight.shape[0]
    half = rows // heads // 2
    order = np.arange(rows).reshape(heads, half, 2).transpose(0, 2, 1).reshape(-1)
    if isinstance(weight, np.ndarray):
        return weight[order]
    zero_point = None if weight.zero_point is None else weight.zero_point[order]
    return replace(weight, codes=weight.codes[order], scale=weight.scale[order], zero_point=zero_point)


def rope(layout: Layout, hyper: Hyper) -> np.ndarray:
    """The inverse frequencies: YaRN's where the layout and the file ask for it (without its
    magnitude factor: Ministral 3's cancels), else linearly scaled."""
    if layout.yarn and hyper.rope_scaling == "yarn" and hyper.rope_factor > 1:
        frequencies, _ = g.yarn_frequencies(
            hyper.head_dim,
            hyper.rope_base,
            hyper.rope_factor,
            hyper.original_context_length or hyper.context_length,
            hyper.yarn_beta_fast,
            hyper.yarn_beta_slow,
            truncate=True,
        )
        return frequencies
    return g.rope_frequencies(hyper.head_dim, hyper.rope_base) / np.float32(hyper.rope_scale)


def query_temperature(graph: g.Inputs, beta: float, length: int) -> ov.Output:
    """1 + beta · ln(1 + floor(position / length)), [batch, 1, positions, 1]."""
    positions = ops.convert(graph.position_ids, ov.Type.f32)
    steps = ops.floor(ops.divide(positions, g.const(float(length), np.float32)))
    scale = ops.add(
        ops.multiply(ops.log(ops.add(steps, g.const(1.0, np.float32))), g.const(beta, np.float32)),
        g.const(1.0, np.float32),
    )
    return ops.unsqueeze(scale, g.const([1, 3])).output(0)


def _scaled(x: ov.Output, factor: float) -> ov.Output:
    return x if factor == 1.0 else ops.multiply(x, g.const(np.float32(factor), np.float32)).output(0)


def builder(layout: Layout) -> Callable[[Hyper, GGUFTensors], ov.Model]:
    return partial(build_dense, layout)


def build_dense(layout: Layout, hyper: Hyper, tensors: GGUFTensors) -> ov.Model:
    graph = g.inputs()
    caches = g.Caches([])
    embeddings = g.matrix(tensors.matrix("token_embd.weight"))
    x = _scaled(ops.gather(embeddings, graph.input_ids, g.const(0)).output(0), hyper.embedding_scale)
    if "rope_freqs.weight" in tensors:
        raise ValueError("rope_freqs.weight (llama 3's rope factors) is not built for this architecture")
    if layout.architecture == MISTRAL3.architecture and "blk.0.ffn_gate_inp.weight" in tensors:
        raise ValueError("mistral3 files with experts (ffn_gate_inp) are not built, only the dense decoder")
    tables = g.rope_tables(graph, rope(layout, hyper))
    mask = g.causal_mask(graph)
    scale = hyper.attention_scale or float(hyper.head_dim**-0.5)
    temperature = None
    if layout.query_temperature and hyper.temperature_scale:
        length = hyper.original_context_length or hyper.context_length
        temperature = query_temperature(graph, hyper.temperature_scale, length)

    def linear(name: str, h: ov.Output, heads: int = 0) -> ov.Output:
        weight = tensors.matrix(name)
        if heads and layout.permuted_qk:
            weight = transformers_order(weight, heads)
        return g.linear(h, g.matrix(weight))

    for layer in range(hyper.layers):
        name = f"blk.{layer}."
        h = x if layout.post_norms else g.rms_norm(x, tensors.values(name + "attn_norm.weight"), hyper.eps)
        q = linear(name + "attn_q.weight", h, hyper.heads)
        k = linear(name + "attn_k.weight", h, hyper.kv_heads)
        v = linear(name + "attn_v.weight", h)
        if layout.whole_qk_norms:
            q = g.rms_norm(q, tensors.values(name + "attn_q_norm.weight"), hyper.eps)
            k = g.rms_norm(k, tensors.values(name + "attn_k_norm.weight"), hyper.eps)
        q = g.to_heads_first(g.split_heads(q, hyper.heads, hyper.head_dim))
        k = g.to_heads_first(g.split_heads(k, hyper.kv_heads, hyper.head_dim))
        if not (layout.no_rope_step and (layer + 1) % layout.no_rope_step == 0):
            q = g.apply_rope(q, tables, hyper.head_dim)
            k = g.apply_rope(k, tables, hyper.head_dim)
        if temperature is not None:
            q = ops.multiply(q, temperature).output(0)
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
