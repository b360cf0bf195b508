"""Gemma 2, GGUF architecture `gemma2`: Gemma 3's decoder (gemma3.py) without the heads'
query and key norms, every other layer local (the even ones, as transformers and
llama.cpp alternate them), one rope base for all layers, and the final logits soft-capped
(`final_logit_softcapping`, 30: logits = tanh(logits / 30) * 30).

The attention scores' own soft cap (`attn_logit_softcapping`, 50) is not applied: the
engine's paged attention has no soft cap, so the graph's attention is the plain scaled
dot product, as optimum-intel exports Gemma 2 (transformers' SDPA attention drops the cap
too). tanh(s / 50) * 50 differs from s by under 1% for |s| < 8.7 and 4% at 17; the
difference measured on a random file is in docs/models.md. The 27B model's
query_pre_attn_scalar is hidden size / heads (144), as llama.cpp takes it; the others'
is the head size.
"""

from __future__ import annotations

import openvino as ov

from ovtrio.gguf.builder.gemma3 import Layout, build_gemma
from ovtrio.gguf.builder.hyper import Hyper
from ovtrio.gguf.builder.tensors import GGUFTensors

ARCHITECTURE = "gemma2"


def is_local(layer: int) -> bool:
    return layer % 2 == 0


def attention_scale(hyper: Hyper) -> float:
    if hyper.layers == 46 and hyper.hidden == 4608:  # Gemma 2 27B
        return float((hyper.hidden / hyper.heads) ** -0.5)
    return float(hyper.head_dim**-0.5)


GEMMA2 = Layout(ARCHITECTURE, is_local, None, False, attention_scale)


def build(hyper: Hyper, tensors: GGUFTensors) -> ov.Model:
    return build_gemma(GEMMA2, hyper, tensors)
