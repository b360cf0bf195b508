"""A mixture of experts' MLP: routed experts chosen per token by a router, and an
optional shared expert every token goes through.

Built in the vectorized form optimum-intel exports MoE models in (its patched
Qwen3-MoE forward): the hidden states tiled once per expert, each projection one batched
MatMul over the stacked experts' weights [experts, rows, columns], the top-k routing
weights scattered into a [tokens, experts] matrix that weighs each expert's output, and a
ReduceSum over the experts. OpenVINO's MoE fusion (FuseVectorizedMOE3GEMM) matches exactly
this pattern and replaces it by its MOE kernel where the device has one (GPU); elsewhere
the graph computes every expert and zero-weights the unchosen ones, which gives the
same numbers at the cost of dense compute (docs/models.md has the figures).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import openvino as ov
import openvino.opset15 as ops

from ovtrio.model.builder import graph as g
from ovtrio.model.builder.tensors import GGUFTensors


@dataclass(frozen=True)
class Routing:
    experts: int  # `expert_count`
    chosen: int  # `expert_used_count`: experts each token goes through
    normalized: bool  # the chosen experts' weights divided by their sum (Qwen3-MoE's norm_topk_prob)


def routed_experts(x: ov.Output, hidden: int, routing: Routing, tensors: GGUFTensors, name: str) -> ov.Output:
    """The routed experts' output for x [batch, length, hidden]; the layer's tensors are
    `name` + ffn_gate_inp (the router [experts, hidden]) and ffn_{gate,up,down}_exps."""
    experts = routing.experts
    for part, rows in (("gate_inp", None), ("gate_exps", None), ("up_exps", None), ("down_exps", hidden)):
        shape = tensors.shape(f"{name}ffn_{part}.weight")
        if shape[0] != experts or (rows is not None and shape[1] != rows):
            raise ValueError(f"{name}ffn_{part}.weight has shape {list(shape)}, not {experts} experts of the model's")
    flat = ops.reshape(x, g.const([-1, hidden]), False)
    logits = g.linear(flat.output(0), g.matrix(tensors.matrix(name + "ffn_gate_inp.weight")))
    probabilities = ops.softmax(logits, -1)
    top = ops.topk(probabilities, g.const(routing.chosen), -1, "max", "none", ov.Type.i64)
    weights, chosen = top.output(0), top.output(1)
    if routing.normalized:
        weights = ops.divide(weights, ops.reduce_sum(weights, g.const([-1]), True)).output(0)
    zeros = ops.broadcast(g.const(0.0, np.float32), ops.shape_of(probabilities))
    per_expert = ops.scatter_elements_update(zeros, chosen, weights, g.const(1))
    per_expert = ops.transpose(per_expert, g.const([1, 0]))  # [experts, tokens]
    batch = ops.gather(ops.shape_of(x), g.const([0]), g.const(0))
    per_expert = ops.reshape(per_expert, ops.concat([g.const([experts]), batch, g.const([-1])], 0), False)
    per_expert = ops.unsqueeze(per_expert, g.const(-1))  # [experts, batch, length, 1]

    tiled = ops.tile(flat, g.const([experts, 1]))
    tiled = ops.reshape(tiled, g.const([experts, -1, hidden]), False).output(0)  # [experts, tokens, hidden]
    gate = ops.matmul(tiled, _stacked(tensors, name + "ffn_gate_exps.weight"), False, True)
    up = ops.matmul(tiled, _stacked(tensors, name + "ffn_up_exps.weight"), False, True)
    down = ops.matmul(ops.multiply(ops.swish(gate), up), _stacked(tensors, name + "ffn_down_exps.weight"), False, True)
    down = ops.reshape(down, ops.concat([g.const([experts]), batch, g.const([-1, hidden])], 0), False)
    return ops.reduce_sum(ops.multiply(down, per_expert), g.const([0]), False).output(0)


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


def _stacked(tensors: GGUFTensors, name: str) -> ov.Output:
    """A stacked experts' weight [experts, rows, columns], its codes kept as a matrix's."""
    return g.matrix(tensors.matrix(name), tensors.shape(name))
