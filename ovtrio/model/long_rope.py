"""Models whose rotary embedding changes with the length they run at (LongRoPE: Phi-3
and Phi-3.5 of 128k context, Phi-4-mini), and what their engine must do for it.

Such a model rotates positions with its "short" factors while the sequence stays within
its original context (`original_max_position_embeddings`, 4,096 for Phi-3) and with its
"long" factors past it; the exported graph picks the factors by the length of the
sequence in the step that computes it. A prompt past the original context prefilled in
parts (the engine's chunks of max_num_batched_tokens, ovtrio's slices, or blocks from
the prefix cache that a shorter prompt computed) thus has its first parts computed with
the short factors where the whole prompt needs the long ones, and the reply is wrong
(docs/models.md#long-prompts-on-longrope-models-phi-3-128k-phi-35-phi-4-mini). Until the
engine recomputes such prompts itself, the server prefills them in one step: the
engine's step budget holds the model's longest prompt, the prefix cache is off for the
model, and its scheduler takes a prompt past the original context into the engine only
when no other prompt is being prefilled (ovtrio/scheduler/prefill.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ovtrio.model.source import ModelSource
    from ovtrio.settings.server import Settings

LONG_ROPE = "longrope"


def original_context(config: dict[str, Any], context_length: int) -> int | None:
    """For a LongRoPE model's config.json (its `rope_scaling`, or transformers' newer
    `rope_parameters`), the original context past which it switches factors; None for
    any other model, or one whose context does not go past it."""
    for key in ("rope_scaling", "rope_parameters"):
        rope = config.get(key)
        if not isinstance(rope, dict) or LONG_ROPE not in (rope.get("rope_type"), rope.get("type")):
            continue
        original = rope.get("original_max_position_embeddings", config.get("original_max_position_embeddings"))
        if isinstance(original, int) and not isinstance(original, bool) and 0 < original < context_length:
            return original
    return None


def whole_prompt_settings(source: ModelSource, settings: Settings) -> Settings:
    """The settings a LongRoPE model's engine runs with: a step budget that holds its
    longest prompt beside every decoding sequence, and no prefix cache (which would hand
    a long prompt blocks a shorter one computed with the short factors, and which
    ovtrio's slices build on). Other models' settings as they are."""
    if source.short_rope_context is None:
        return settings
    budget = max(settings.max_num_batched_tokens, source.context_length + settings.max_num_seqs)
    return settings.model_copy(update={"max_num_batched_tokens": budget, "enable_prefix_caching": False})
