"""Building blocks of a decoder's OpenVINO graph, in the shape the engine expects.

The model is stateful as optimum-intel exports it: inputs `input_ids`, `attention_mask`,
`position_ids` and `beam_idx`; per layer a key and a value cache held in variables
(ReadValue → Gather by beam_idx → Concat with the new positions → Assign) feeding a
ScaledDotProductAttention, with GQA's heads repeated by Unsqueeze → Broadcast → Reshape.
The continuous-batching pipeline rewrites each such attention into its paged attention
(OpenVINO's SDPAToPagedAttention): it keeps the scale and the attention's sinks (its
sixth input, gpt-oss's), takes a sliding window from a mask built as `sliding_mask` builds
it (the pattern it reads gpt-oss's window from), and drops every other mask, computing
causal attention itself. The masks are still the true
ones, so the stateful graph computes the same attention on its own (the tests compare it
with a numpy forward pass).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import openvino as ov
import openvino.opset15 as ops
from openvino.utils.node_factory import NodeFactory

from ovtrio.gguf.builder.weights import Codes

# opset13's Python factory has no argument for the attention's sinks; its node factory takes them.
_OPSET13 = NodeFactory("opset13")
_NEGATIVE = np.float32(-3.4e38)  # a masked score: exp() of it is 0, and no inf - inf makes a NaN


def const(value: object, dtype: type = np.int64) -> ov.Output:
    return ops.constant(np.asarray(value, dtype=dtype)).output(0)


def named(node: ov.Node, name: str) -> ov.Node:
    node.set_friendly_name(name)
    node.output(0).set_names({name})
    return node


@dataclass(frozen=True)
class Inputs:
    """The model's inputs and the shapes derived from them once."""

    input_ids: ov.Node
    attention_mask: ov.Node
    position_ids: ov.Node
    beam_idx: ov.Node
    batch: ov.Output  # [1]
    length: ov.Output  # [1]: new positions in this call
    total: ov.Output  # [1]: positions cached and new
    key_positions: ov.Output  # [total]
    query_positions: ov.Output  # [length, 1]

    @property
    def parameters(self) -> list[ov.Node]:
        return [self.input_ids, self.attention_mask, self.position_ids, self.beam_idx]


def inputs() -> Inputs:
    input_ids = named(ops.parameter([-1, -1], ov.Type.i64), "input_ids")
    attention_mask = named(ops.parameter([-1, -1], ov.Type.i64), "attention_mask")
    position_ids = named(ops.parameter([-1, -1], ov.Type.i64), "position_ids")
    beam_idx = named(ops.parameter([-1], ov.Type.i32), "beam_idx")
    ids_shape = ops.shape_of(input_ids)
    batch = ops.gather(ids_shape, const([0]), const(0)).output(0)
    length = ops.gather(ids_shape, const([1]), const(0)).output(0)
    total = ops.gather(ops.shape_of(attention_mask), const([1]), const(0)).output(0)
    scalar_total = ops.squeeze(total, const(0))
    key_positions = ops.range(const(0), scalar_total, const(1), ov.Type.i64).output(0)
    past = ops.squeeze(ops.subtract(total, length), const(0))
    query_positions = ops.unsqueeze(ops.range(past, scalar_total, const(1), ov.Type.i64), const(1)).output(0)
    return Inputs(
        input_ids, attention_mask, position_ids, beam_idx, batch, length, total, key_positions, query_positions
    )


def matrix(codes: Codes | np.ndarray) -> ov.Output:
    """A weight [rows, columns] as f32: a constant, or its codes in the decompression pattern."""
    if isinstance(codes, np.ndarray):
        node = ops.constant(codes)
        return node.output(0) if codes.dtype == np.float32 else ops.convert(node, ov.Type.f32).output(0)
    rows = codes.codes.shape[0]
    if codes.bits == 4:
        packed = ov.Tensor(ov.Type.f4e2m1 if codes.microscaled else ov.Type.u4, list(codes.codes.shape))
        packed.data[:] = _pack_u4(codes.codes)
        stored = ops.constant(packed)
    else:
        stored = ops.constant(codes.codes)
    values = ops.convert(stored, ov.Type.f32)
    if codes.zero_point is not None:
        values = ops.subtract(values, ops.constant(codes.zero_point))
    if codes.microscaled:
        exponents = ov.Tensor(ov.Type.f8e8m0, list(codes.scale.shape))
        exponents.data[:] = codes.scale
        values = ops.multiply(values, ops.convert(ops.constant(exponents), ov.Type.f32))
    else:
        values = ops.multiply(values, ops.constant(codes.scale))
    return ops.reshape(values, const([rows, -1]), False).output(0)


def _pack_u4(codes: np.ndarray) -> np.ndarray:
    """Two 4-bit codes a byte, the first in the low nibble (OpenVINO's u4 and f4e2m1 layout)."""
    flat = codes.reshape(-1).astype(np.uint8)
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)


def linear(x: ov.Output, weight: ov.Output, bias: np.ndarray | None = None) -> ov.Output:
    out = ops.matmul(x, weight, False, True)
    return (ops.add(out, ops.constant(bias)) if bias is not None else out).output(0)


def rms_norm(x: ov.Output, weight: np.ndarray, eps: float) -> ov.Output:
    """x / sqrt(mean(x²) + eps) * weight, over the last axis (the form the plugin fuses)."""
    mean_square = ops.reduce_mean(ops.power(x, const(2.0, np.float32)), const([-1]), True)
    inverse = ops.divide(const(1.0, np.float32), ops.sqrt(ops.add(mean_square, const(eps, np.float32))))
    return ops.multiply(ops.multiply(x, inverse), ops.constant(weight.astype(np.float32))).output(0)


def rope_tables(graph: Inputs, inverse_frequencies: np.ndarray, attention_factor: float = 1.0) -> tuple[ov.Output, ...]:
    """cos and sin [batch, 1, length, head_dim] of the positions, for the rotate-half form."""
    positions = ops.convert(ops.unsqueeze(graph.position_ids, const(-1)), ov.Type.f32)
    angles = ops.multiply(positions, ops.constant(inverse_frequencies.astype(np.float32).reshape(1, 1, -1)))
    angles = ops.concat([angles, angles], -1)
    cos, sin = ops.cos(angles), ops.sin(angles)
    if attention_factor != 1.0:
        cos = ops.multiply(cos, const(attention_factor, np.float32))
        sin = ops.multiply(sin, const(attention_factor, np.float32))
    return ops.unsqueeze(cos, const(1)).output(0), ops.unsqueeze(sin, const(1)).output(0)


def rope_frequencies(head_dim: int, theta: float, rotary_dim: int | None = None) -> np.ndarray:
    dim = rotary_dim or head_dim
    return (1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))).astype(np.float32)


def apply_rope(x: ov.Output, tables: tuple[ov.Output, ...], head_dim: int, rotary_dim: int | None = None) -> ov.Output:
    """x * cos + rotate_half(x) * sin, x [batch, heads, length, head_dim] (NeoX order); with
    `rotary_dim` below head_dim only the first rotary_dim dimensions turn (partial rotary,
    the tables built for rotary_dim), the rest pass as they are."""
    cos, sin = tables
    dim = rotary_dim or head_dim
    turned = x if dim == head_dim else ops.slice(x, const([0]), const([dim]), const([1]), const([3])).output(0)
    half = dim // 2
    first = ops.slice(turned, const([0]), const([half]), const([1]), const([3]))
    second = ops.slice(turned, const([half]), const([dim]), const([1]), const([3]))
    rotated = ops.concat([ops.negative(second), first], 3)
    out = ops.add(ops.multiply(turned, cos), ops.multiply(rotated, sin))
    if dim == head_dim:
        return out.output(0)
    passed = ops.slice(x, const([dim]), const([head_dim]), const([1]), const([3]))
    return ops.concat([out, passed], 3).output(0)


def longrope_frequencies(
    rotary_dim: int, theta: float, factors: np.ndarray, context_length: int, original_context_length: int
) -> tuple[np.ndarray, float]:
    """LongRoPE (Phi-3.5, Phi-4-mini): each inverse frequency divided by its factor, and the
    attention factor sqrt(1 + ln(scale) / ln(original)) that multiplies cos and sin, scale
    being context_length / original_context_length (1 when not above 1)."""
    frequencies = rope_frequencies(rotary_dim, theta) / factors.astype(np.float32).reshape(-1)
    scale = context_length / original_context_length if original_context_length else 1.0
    factor = float(np.sqrt(1 + np.log(scale) / np.log(original_context_length))) if scale > 1.0 else 1.0
    return frequencies.astype(np.float32), factor


def yarn_frequencies(
    dim: int,
    theta: float,
    factor: float,
    original_context_length: int,
    beta_fast: float,
    beta_slow: float,
    truncate: bool = False,
) -> tuple[np.ndarray, float]:
    """YaRN as transformers computes it: each inverse frequency blended between its own
    (extrapolated, for dimensions turning more than `beta_fast` times over the original
    context) and itself divided by `factor` (interpolated, for those turning fewer than
    `beta_slow` times), linearly between the two correction dimensions, rounded outwards to
    whole dimensions with `truncate` (as llama.cpp always rounds them; gpt-oss's config
    turns it off, Ministral 3's leaves it on); and the attention factor 0.1 ln(factor) + 1
    that multiplies cos and sin."""

    def correction_dim(rotations: float) -> float:
        return float(dim * np.log(original_context_length / (rotations * 2 * np.pi)) / (2 * np.log(theta)))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = float(np.floor(low)), float(np.ceil(high))
    low, high = max(low, 0.0), min(high, dim - 1.0)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    extrapolated = 1.0 - ramp
    own = rope_frequencies(dim, theta)
    frequencies = (own / np.float32(factor)) * (1 - extrapolated) + own * extrapolated
    attention_factor = float(0.1 * np.log(factor) + 1.0) if factor > 1 else 1.0
    return frequencies.astype(np.float32), attention_factor


def _padding(graph: Inputs) -> ov.Output:
    mask = ops.convert(graph.attention_mask, ov.Type.boolean)
    return ops.unsqueeze(mask, const([1, 2])).output(0)  # [batch, 1, 1, total]


def causal_mask(graph: Inputs) -> ov.Output:
    """0 where a query may see a key (not after it, not padding), a large negative elsewhere."""
    allowed = ops.less_equal(graph.key_positions, graph.query_positions)
    allowed = ops.logical_and(ops.unsqueeze(allowed, const([0, 1])), _padding(graph))
    return ops.select(allowed, const(0.0, np.float32), const(_NEGATIVE, np.float32)).output(0)


def sliding_mask(graph: Inputs, window: int) -> ov.Output:
    """As causal_mask, and a key at most `window - 1` positions before its query: built as
    key > query - window, combined by BitwiseAnd, broadcast, selected and sliced, which is
    what SDPAToPagedAttention reads a window from."""
    causal = ops.less_equal(graph.key_positions, graph.query_positions)
    inside = ops.greater(graph.key_positions, ops.add(graph.query_positions, const(-window)))
    true = const(True, np.bool_)
    allowed = ops.bitwise_and(causal, inside)
    allowed = ops.bitwise_and(allowed, true)
    allowed = ops.bitwise_and(true, allowed)
    allowed = ops.bitwise_and(allowed, _padding(graph))
    shape = ops.concat([graph.batch, const([1]), graph.length, graph.total], 0)
    mask = ops.select(ops.broadcast(allowed, shape), const(0.0, np.float32), const(_NEGATIVE, np.float32))
    return ops.slice(mask, const([0]), graph.total, const([1]), const([3])).output(0)


def split_heads(x: ov.Output, heads: int, head_dim: int) -> ov.Output:
    """[batch, length, heads * head_dim] → [batch, length, heads, head_dim]."""
    return ops.reshape(x, const([0, 0, heads, head_dim]), True).output(0)


def to_heads_first(x: ov.Output) -> ov.Output:
    return ops.transpose(x, const([0, 2, 1, 3])).output(0)


@dataclass
class Caches:
    """The Assign nodes of every layer's key and value caches (the model's sinks)."""

    assigns: list[ov.Node]

    def cached(
        self, graph: Inputs, layer: int, kind: str, current: ov.Output, kv_heads: int, head_dim: int
    ) -> ov.Output:
        """The positions cached so far with `current` [batch, kv_heads, length, head_dim] after them."""
        info = ov.op.util.VariableInfo()
        info.data_shape = ov.PartialShape([-1, kv_heads, -1, head_dim])
        info.data_type = ov.Type.f32
        info.variable_id = f"past_key_values.{layer}.{kind}present.{layer}.{kind}"
        variable = ov.op.util.Variable(info)
        empty = ops.broadcast(
            const(0.0, np.float32), ops.concat([graph.batch, const([kv_heads]), const([0]), const([head_dim])], 0)
        )
        past = ops.gather(ops.read_value(empty, variable), graph.beam_idx, const(0))
        joined = ops.concat([past, current], 2)
        self.assigns.append(ops.assign(joined, variable))
        return joined.output(0)


def repeat_kv(x: ov.Output, graph: Inputs, heads: int, kv_heads: int, head_dim: int) -> ov.Output:
    """GQA: each of `kv_heads` repeated for its heads // kv_heads query heads."""
    if heads == kv_heads:
        return x
    groups = heads // kv_heads
    length = ops.gather(ops.shape_of(x), const([2]), const(0))
    shape = ops.concat([graph.batch, const([kv_heads]), const([groups]), length, const([head_dim])], 0)
    expanded = ops.broadcast(ops.unsqueeze(x, const(2)), shape)
    return ops.reshape(expanded, const([0, heads, -1, head_dim]), True).output(0)


def attention(
    graph: Inputs,
    caches: Caches,
    layer: int,
    query: ov.Output,
    key: ov.Output,
    value: ov.Output,
    mask: ov.Output,
    scale: float,
    heads: int,
    kv_heads: int,
    head_dim: int,
    sinks: np.ndarray | None = None,
) -> ov.Output:
    """Attention of query [batch, heads, length, head_dim] over the cached and new keys and
    values [batch, kv_heads, length, head_dim]; the result [batch, length, heads * head_dim].

    `sinks` (gpt-oss), one learned logit per head, join each query's softmax as a key of
    their own that has no value: exp(sink) adds to the denominator only. They are the
    attention's sixth input, of shape [1, heads, 1, 1], which SDPAToPagedAttention hands
    on to the paged attention as its sinks (it takes a static rank-4 input whose third
    dimension from the end is the query's heads)."""
    keys = repeat_kv(caches.cached(graph, layer, "key", key, kv_heads, head_dim), graph, heads, kv_heads, head_dim)
    values = repeat_kv(
        caches.cached(graph, layer, "value", value, kv_heads, head_dim), graph, heads, kv_heads, head_dim
    )
    scale_input = const(scale, np.float32)
    if sinks is None:
        context = ops.scaled_dot_product_attention(query, keys, values, mask, scale_input, causal=False)
    else:
        sink_input = ops.constant(sinks.astype(np.float32).reshape(1, heads, 1, 1)).output(0)
        context = _OPSET13.create(
            "ScaledDotProductAttention", [query, keys, values, mask, scale_input, sink_input], {"causal": False}
        )
    context = ops.transpose(context, const([0, 2, 1, 3]))
    return ops.reshape(context, ops.concat([graph.batch, graph.length, const([heads * head_dim])], 0), False).output(0)


def model(graph: Inputs, logits: ov.Output, caches: Caches, name: str) -> ov.Model:
    result = ops.result(logits)
    result.output(0).set_names({"logits"})
    return ov.Model([result], caches.assigns, graph.parameters, name)
