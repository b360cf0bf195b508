"""What a request may ask of this model: the longest sequence it can hold, and the
server's defaults for what a request leaves unset."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ovtrio.config import Settings
from ovtrio.model.source import ModelSource
from ovtrio.model.speculation import Speculation, speculation_for

# Defaults a model's generation_config.json may set for requests that leave them out.
GENERATION_DEFAULTS = ("temperature", "top_p", "top_k", "repetition_penalty")


@dataclass(frozen=True)
class SequenceLimit:
    """The most tokens (prompt + output) one request may hold, and what sets it: the
    model's context window, or a KV cache too small for even that (a request that can
    never fit in the cache would only be dropped by the engine halfway)."""

    tokens: int
    what: str  # e.g. "This model's maximum context length"


@dataclass(frozen=True)
class ServerDefaults:
    """Server-side defaults: the model's generation_config.json, the operator's cap, and
    how the pipeline speculates (with its per-request defaults)."""

    generation: dict[str, Any] = field(default_factory=dict)
    max_tokens_limit: int | None = None
    speculation: Speculation = Speculation()

    def get(self, name: str, fallback: Any) -> Any:
        value = self.generation.get(name)
        return fallback if value is None else value


def sequence_limit(source: ModelSource, kv_capacity: int) -> SequenceLimit:
    """The model's context, or the KV cache's capacity when that is smaller."""
    if 0 < kv_capacity < source.context_length:
        return SequenceLimit(kv_capacity, "This server's KV cache size")
    return SequenceLimit(source.context_length, "This model's maximum context length")


def server_defaults(source: ModelSource, settings: Settings) -> ServerDefaults:
    return ServerDefaults(
        {name: source.generation_defaults.get(name) for name in GENERATION_DEFAULTS},
        settings.max_tokens_limit,
        speculation_for(settings, source),
    )
