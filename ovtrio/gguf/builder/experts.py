"""A mixture of experts' MLP: routed experts chosen per token by a router, and an
optional shared expert every token goes through.

Built as three 2-D MatMuls a layer over every expert at once: the experts' gate and up
matrices stacked row after row ([experts x rows, hidden]), their down matrices side by
side ([hidden, experts x rows]), each kept as its codes in the decompression pattern
the CPU plugin fuses into its MatMul; the top-k routing weights, scattered into a
[tokens, experts] matrix, weigh each expert's activations before the down projection, so
that MatMul sums the chosen experts' outputs (the others weighed zero). Biases (gpt-oss)
join as the file has them: the router's on its logits, the gate's and up's on the
stacked rows, and the down projection's weighed by the same [tokens, experts] matrix
([tokens, experts] x [experts, hidden]), so each chosen expert adds its own bias times
its weight. The gated activation is the family's (SwiGLU, or gpt-oss's clamped one).

Every expert is computed for every token, as the CPU plugin (2026.4) has no MoE kernel;
but the weights stay compressed. The form optimum-intel exports (the hidden states tiled
per expert, batched MatMuls over [experts, rows, columns]), which OpenVINO fuses into its
MOE kernel on GPU, has the CPU plugin fold the stacked experts into f32 constants: 8.6 GB
resident for a file of 810 MB (docs/benchmarks.md#gguf-architectures-built-by-ovtrio).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import openvino as ov
import openvino.opset15 as ops

from ovtrio.gguf.builder import graph as g
from ovtrio.gguf.builder.tensors import GGUFTensors
from ovtrio.gguf.builder.weights import Codes


@dataclass(frozen=True)
class Routing:
    experts: int  # `expert_count`
    chosen: int  # `expert_used_count`: experts each token goes through
    normalized: bool  # the chosen experts' weights divided by their sum (Qwen3-MoE's norm_topk_prob)
    # gpt-oss: the top k of the router's logits chosen first, their weights the softmax of those k
    softmax_of_chosen: bool = False


# An expert's gated activation of its gate and up projections, [tokens, experts x rows] each.
Activation = Callable[[ov.Output, ov.Output], ov.Output]


def swiglu(gate: ov.Output, up: ov.Output) -> ov.Output:
    return ops.multiply(ops.swish(gate), up).output(0)


def routed_experts(
    x: ov.Output, hidden: int, routing: Routing, tensors: GGUFTensors, name: str, activation: Activation = swiglu
) -> ov.Output:
    """The routed experts' output for x [batch, length, hidden]; the layer's tensors are
    `name` + ffn_gate_inp (the router [experts, hidden]) and ffn_{gate,up,down}_exps, each
    with its `.bias` where the file has one (gpt-oss: [experts] for the router, [experts,
    rows] for the experts' projections). A file converted with llama.cpp's
    --fuse-gate-up-exps has ffn_gate_up_exps instead of the gate and up: each expert's
    gate rows, then its up rows (and its bias so)."""
    experts = routing.experts
    fused = f"{name}ffn_gate_up_exps.weight" in tensors
    parts = ("gate_up_exps",) if fused else ("gate_exps", "up_exps")
    for part, rows in (("gate_inp", None), *((part, None) for part in parts), ("down_exps", hidden)):
        shape = tensors.shape(f"{name}ffn_{part}.weight")
        if shape[0] != experts or (rows is not None and shape[1] != rows):
            raise ValueError(f"{name}ffn_{part}.weight has shape {list(shape)}, not {experts} experts of the model's")
    flat = ops.reshape(x, g.const([-1, hidden]), False)
    logits = g.linear(
        flat.output(0), g.matrix(tensors.matrix(name + "ffn_gate_inp.weight")), _bias(tensors, name + "ffn_gate_inp")
    )
    if routing.softmax_of_chosen:
        top = ops.topk(logits, g.const(routing.chosen), -1, "max", "none", ov.Type.i64)
        weights, chosen = ops.softmax(top.output(0), -1).output(0), top.output(1)
    else:
        top = ops.topk(ops.softmax(logits, -1), g.const(routing.chosen), -1, "max", "none", ov.Type.i64)
        weights, chosen = top.output(0), top.output(1)
    if routing.normalized:
        weights = ops.divide(weights, ops.reduce_sum(weights, g.const([-1]), True)).output(0)
    zeros = ops.broadcast(g.const(0.0, np.float32), ops.shape_of(logits))
    per_expert = ops.scatter_elements_update(zeros, chosen, weights, g.const(1))  # [tokens, experts]

    def stacked(part: str) -> ov.Output:
        bias = _bias(tensors, name + f"ffn_{part}_exps")
        weight = g.matrix(_side_by_side(tensors, name + f"ffn_{part}_exps.weight", False))
        return g.linear(flat.output(0), weight, None if bias is None else bias.reshape(-1))

    rows = tensors.shape(name + "ffn_down_exps.weight")[2]
    if fused:  # [tokens, experts x (gate rows, up rows)] split per expert
        both = ops.reshape(stacked("gate_up"), g.const([-1, experts, 2, rows]), False)
        gate, up = (
            ops.reshape(ops.gather(both, g.const(half), g.const(2)), g.const([-1, experts * rows]), False).output(0)
            for half in (0, 1)
        )
    else:
        gate, up = stacked("gate"), stacked("up")
    active = activation(gate, up)  # [tokens, experts x rows]
    weighed = ops.multiply(
        ops.reshape(active, g.const([-1, experts, rows]), False), ops.unsqueeze(per_expert, g.const(-1))
    )
    weighed = ops.reshape(weighed, g.const([-1, experts * rows]), False).output(0)
    down = g.linear(weighed, g.matrix(_side_by_side(tensors, name + "ffn_down_exps.weight", True)))
    if (down_bias := _bias(tensors, name + "ffn_down_exps")) is not None:
        # Each chosen expert's bias, weighed as its output is: [tokens, experts] x [experts, hidden].
        down = ops.add(down, ops.matmul(per_expert, ops.constant(down_bias.reshape(experts, hidden)), False, False))
    return ops.reshape(down, ops.shape_of(x), False).output(0)


def _bias(tensors: GGUFTensors, name: str) -> np.ndarray | None:
    return tensors.values(name + ".bias") if name + ".bias" in tensors else None


def shared_expert(x: ov.Output, tensors: GGUFTensors, name: str) -> ov.Output:
    """Qwen2-MoE's shared expert: a SwiGLU MLP (ffn_{gate,up,down}_shexp) scaled per token
    by sigmoid(x · ffn_gate_inp_shexp)."""
    gate = g.linear(x, g.matrix(tensors.matrix(name + "ffn_gate_shexp.weight")))
    up = g.linear(x, g.matrix(tensors.matrix(name + "ffn_up_shexp.weight")))
    out = g.linear(
        ops.multiply(ops.swish(gate), up).output(0), g.matrix(tensors.matrix(name + "ffn_down_shexp.weight"))
    )
    gate_weight = tensors.values(name + "ffn_gate_inp_shexp.weight").reshape(1, -1)
    scale = ops.sigmoid(g.linear(x, ops.constant(gate_weight).output(0)))
    return ops.multiply(out, scale).output(0)


def _side_by_side(tensors: GGUFTensors, name: str, columns: bool) -> Codes | np.ndarray:
    """A stacked experts' weight [experts, rows, columns] as one 2-D weight: the experts'
    rows one after another [experts x rows, columns], or (`columns`) their columns side
    by side [rows, experts x columns]. Codes are regrouped as they are (a group never
    crosses a row), so the weight is the file's, still compressed."""
    experts, rows, cols = tensors.shape(name)
    weight = tensors.matrix(name)
    if isinstance(weight, np.ndarray):
        stacked = weight.reshape(experts, rows, cols)
        return stacked.transpose(1, 0, 2).reshape(rows, -1) if columns else stacked.reshape(experts * rows, cols)

    def regrouped(part: np.ndarray) -> np.ndarray:
        grouped = part.reshape(experts, rows, -1, part.shape[-1])
        if columns:
            return np.ascontiguousarray(grouped.transpose(1, 0, 2, 3)).reshape(rows, -1, part.shape[-1])
        return grouped.reshape(experts * rows, -1, part.shape[-1])

    zero_point = None if weight.zero_point is None else regrouped(weight.zero_point)
    return replace(weight, codes=regrouped(weight.codes), scale=regrouped(weight.scale), zero_point=zero_point)
