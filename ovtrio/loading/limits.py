"""What a request may ask of this model: the longest sequence it can hold, how much one
request may cost, how much work the server takes on at once, and the server's defaults
for what a request leaves unset."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ovtrio.engine.backend import engine_backend, npu_context
from ovtrio.loading.load import block_tokens
from ovtrio.loading.speculation import Speculation, speculation_for
from ovtrio.model.source import ModelSource
from ovtrio.settings.server import Settings

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


def sequence_limit(source: ModelSource, kv_capacity: int, settings: Settings | None = None) -> SequenceLimit:
    """The model's context, or the KV cache's capacity when that is smaller, or on NPU
    the context the model is compiled for (ovtrio/engine/backend.py)."""
    if settings is not None and (compiled := npu_context(settings)) is not None:
        return SequenceLimit(compiled, "This server's NPU context (--max-prompt-len + --min-response-len)")
    if 0 < kv_capacity < source.context_length:
        return SequenceLimit(kv_capacity, "This server's KV cache size")
    return SequenceLimit(source.context_length, "This model's maximum context length")


def server_defaults(source: ModelSource, settings: Settings) -> ServerDefaults:
    return ServerDefaults(
        {name: source.generation_defaults.get(name) for name in GENERATION_DEFAULTS},
        settings.max_tokens_limit,
        speculation_for(settings, source),
    )


# KV cache tokens set aside for each running sequence when the running limit is left to
# the server: a chat turn of a few hundred prompt tokens and a reply, with room to spare,
# so that the cache holds every running sequence without the engine preempting any.
TOKENS_PER_RUNNING_SEQUENCE = 1024
# Waiting requests per running sequence, by default: a request taken on waits for at most
# about two rounds of the running ones before it starts.
QUEUE_PER_RUNNING = 2
# Choices (n x prompts) one request may have, by default: an lm-evaluation-harness batch
# or n = 16 for four prompts; uncapped, a long prompt list costs much memory (see
# docs/benchmarks.md#request-limits-and-prefill-slices).
DEFAULT_MAX_CHOICES = 64


@dataclass(frozen=True)
class RequestCaps:
    """The most one request may ask for: prompts (completions), choices (n x prompts),
    prompt tokens (all prompts together) and stop strings."""

    prompts: int
    choices: int
    prompt_tokens: int
    schema_bytes: int | None = None  # JSON of one output format or tool's parameters
    stop_strings: int = 64


@dataclass(frozen=True)
class WorkLimits:
    """How much the server takes on at once: sequences in the engine, requests waiting."""

    running_sequences: int
    queued_requests: int


# Requests waiting behind the one the stateful backend runs, by default.
STATEFUL_QUEUE = 16


def work_limits(settings: Settings, kv_capacity: int) -> WorkLimits:
    """The configured limits, or defaults from the engine's max_num_seqs and the KV cache
    (`kv_capacity` tokens; 0 when unknown). The stateful backend runs one request."""
    if engine_backend(settings) == "stateful":
        queued = settings.max_queued_requests
        return WorkLimits(1, STATEFUL_QUEUE if queued is None else queued)
    running = settings.max_running_sequences
    if running is None:
        running = settings.max_num_seqs
        if kv_capacity > 0:
            running = max(1, min(running, kv_capacity // TOKENS_PER_RUNNING_SEQUENCE))
    queued = settings.max_queued_requests
    if queued is None:
        queued = QUEUE_PER_RUNNING * running
    return WorkLimits(running, queued)


def request_caps(settings: Settings, source: ModelSource, kv_capacity: int, limits: WorkLimits) -> RequestCaps:
    choices = settings.max_choices_per_request or min(DEFAULT_MAX_CHOICES, limits.running_sequences)
    prompt_tokens = settings.max_prompt_tokens_per_request
    if prompt_tokens is None:
        # More than the cache holds could never be in the engine together.
        prompt_tokens = kv_capacity if kv_capacity > 0 else settings.max_prompts_per_request * source.context_length
    return RequestCaps(
        settings.max_prompts_per_request, choices, prompt_tokens, settings.max_schema_bytes, settings.max_stop_strings
    )


# Prompts up to this long go to the engine whole under the adaptive slices: one step
# beside the decoding sequences holds them (the step budget of ovtrio's earlier releases).
ADAPTIVE_SLICE_ABOVE = 256


def prefill_slice_tokens(settings: Settings, device: str) -> int:
    """Prompts longer than this are prefilled in slices (ovtrio/scheduler/prefill.py), in
    whole KV blocks; 0 (off) without prefix caching, which the slices build on.

    By default (no long_prefill_token_threshold) prompts longer than 256 tokens, in the
    slices the scheduler's prefill policy sizes (ovtrio/scheduler/prefill_policy.py,
    `prefill_itl_bound`). An explicit threshold gives fixed slices of that size: a short
    request that arrives during a slice waits for the slice's step and then for its own
    (figures for three eighths of a 256-token step:
    docs/benchmarks.md#request-limits-and-prefill-slices)."""
    if not settings.enable_prefix_caching:
        return 0
    threshold = settings.long_prefill_token_threshold
    if threshold is None:
        threshold = ADAPTIVE_SLICE_ABOVE
    if threshold <= 0:
        return 0
    block = block_tokens(device)
    return max(block, threshold // block * block)


def prefill_itl_bound(settings: Settings) -> float | None:
    """The bound, in seconds, that sizes the slices of long prompts beside decoding
    sequences (max_itl_ms); None with an explicit long_prefill_token_threshold, whose
    slices are fixed."""
    if settings.long_prefill_token_threshold is not None:
        return None
    return settings.max_itl_ms / 1000
