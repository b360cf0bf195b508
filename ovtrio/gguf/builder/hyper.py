"""A decoder's hyper-parameters, read from a GGUF file's metadata (`<architecture>.*` keys)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class MissingMetadata(ValueError):
    """A key the architecture needs is not in the file; the message names it."""


@dataclass(frozen=True)
class Hyper:
    architecture: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    feed_forward: int
    eps: float
    context_length: int
    rope_base: float
    rope_scale: float  # linear scaling of the positions (1: none)
    sliding_window: int  # 0: none
    final_softcap: float  # 0: none
    rotary_dim: int  # dimensions of each head rotated (partial rotary below head_dim)
    original_context_length: int  # the context the rope was trained at before scaling (0: not scaled)
    experts: int = 0  # routed experts of a mixture-of-experts MLP (0: a dense MLP)
    experts_used: int = 0  # experts each token goes through
    # Granite's multipliers (1, or 0 for attention_scale: 1/sqrt(head_dim), where absent).
    embedding_scale: float = 1.0
    residual_scale: float = 1.0
    attention_scale: float = 0.0
    logit_scale: float = 1.0
    # The rope's scaling as the file names it (`rope.scaling.type`: none, linear, yarn), its
    # factor, and YaRN's correction range in rotations (32 and 1 where the file has none).
    rope_scaling: str = "none"
    rope_factor: float = 1.0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    temperature_scale: float = 0.0  # Ministral 3's query temperature by position (0: none)


def read_hyper(metadata: Mapping[str, Any]) -> Hyper:
    """The hyper-parameters in `metadata`. Raises MissingMetadata naming a missing key."""
    arch = str(metadata.get("general.architecture"))

    def need(key: str) -> Any:
        full = f"{arch}.{key}"
        if full not in metadata:
            raise MissingMetadata(f"the file has no '{full}'")
        return metadata[full]

    def optional(key: str, default: Any) -> Any:
        return metadata.get(f"{arch}.{key}", default)

    hidden = int(need("embedding_length"))
    heads = int(need("attention.head_count"))
    scaling = optional("rope.scaling.type", "none")
    experts = int(optional("expert_count", 0))
    return Hyper(
        architecture=arch,
        hidden=hidden,
        layers=int(need("block_count")),
        heads=heads,
        kv_heads=int(optional("attention.head_count_kv", heads)),
        head_dim=int(optional("attention.key_length", hidden // heads)),
        # A mixture of experts' MLP is sized by expert_feed_forward_length instead.
        feed_forward=int(optional("feed_forward_length", 0) if experts else need("feed_forward_length")),
        eps=float(need("attention.layer_norm_rms_epsilon")),
        context_length=int(optional("context_length", 2048)),
        rope_base=float(optional("rope.freq_base", 10_000.0)),
        rope_scale=float(optional("rope.scaling.factor", 1.0)) if scaling == "linear" else 1.0,
        sliding_window=int(optional("attention.sliding_window", 0)),
        final_softcap=float(optional("final_logit_softcapping", 0.0)),
        rotary_dim=int(optional("rope.dimension_count", int(optional("attention.key_length", hidden // heads)))),
        original_context_length=int(optional("rope.scaling.original_context_length", 0)),
        experts=experts,
        experts_used=int(need("expert_used_count")) if experts else 0,
        embedding_scale=float(optional("embedding_scale", 1.0)),
        residual_scale=float(optional("residual_scale", 1.0)),
        attention_scale=float(optional("attention.scale", 0.0)),
        logit_scale=float(optional("logit_scale", 1.0)),
        rope_scaling=str(scaling),
        rope_factor=float(optional("rope.scaling.factor", 1.0)),
        yarn_beta_fast=float(optional("rope.scaling.yarn_beta_fast", 32.0)),
        yarn_beta_slow=float(optional("rope.scaling.yarn_beta_slow", 1.0)),
        temperature_scale=float(optional("attention.temperature_scale", 0.0)),
    )
