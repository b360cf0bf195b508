"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B), GGUF architecture `qwen2moe`: Qwen3-MoE's
decoder (qwen3moe.py) with biases on the query, key and value projections and no per-head
norms, the chosen experts weighted by the router's softmax as it is (not renormalized:
norm_topk_prob is false), and a shared expert every token goes through, scaled by a
sigmoid gate of its own (experts.shared_expert).
"""

from __future__ import annotations

import openvino as ov

from ovtrio.gguf.builder.hyper import Hyper
from ovtrio.gguf.builder.qwen3moe import Layout, build_qwen_moe
from ovtrio.gguf.builder.tensors import GGUFTensors

ARCHITECTURE = "qwen2moe"
QWEN2MOE = Layout(ARCHITECTURE, head_norms=False, normalized_routing=False)


def build(hyper: Hyper, tensors: GGUFTensors) -> ov.Model:
    return build_qwen_moe(QWEN2MOE, hyper, tensors)
