"""The one place that turns a validated request into SamplingParams.

A new sampling parameter touches its field in protocol.py, this function, and
scheduler/params.py's to_generation_config.
"""

from __future__ import annotations

from dataclasses import dataclass

from ovtrio.api.errors import invalid
from ovtrio.api.protocol import ChatCompletionRequest, SamplingFields
from ovtrio.scheduler import SamplingParams

DEFAULT_TEMPERATURE = 1.0


@dataclass(frozen=True)
class SequenceLimit:
    """The most tokens (prompt + output) one request may hold, and what sets it: the
    model's context window, or a KV cache too small for even that (a request that can
    never fit in the cache would only be dropped by the engine halfway)."""

    tokens: int
    what: str  # e.g. "This model's maximum context length"


def sampling_params(body: SamplingFields, prompt_tokens: int, limit: SequenceLimit) -> SamplingParams:
    """Check the request against the sequence limit and build its SamplingParams.

    Without max_tokens, generation may run to the end of the limit, as with OpenAI's API.
    """
    room = limit.tokens - prompt_tokens
    if room < 1:
        raise invalid(
            f"{limit.what} is {limit.tokens} tokens, but the prompt is"
            f" {prompt_tokens} tokens. Please shorten the prompt.",
            "messages" if isinstance(body, ChatCompletionRequest) else "prompt",
            "context_length_exceeded",
        )
    max_tokens = body.max_tokens
    param = "max_tokens"
    if isinstance(body, ChatCompletionRequest) and body.max_completion_tokens is not None:
        max_tokens, param = body.max_completion_tokens, "max_completion_tokens"
    if max_tokens is None:
        max_tokens = room
    elif max_tokens > room:
        raise invalid(
            f"{limit.what} is {limit.tokens} tokens. However, you requested"
            f" {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} for the"
            f" completion). Please reduce the prompt or {param}.",
            param,
            "context_length_exceeded",
        )
    temperature = DEFAULT_TEMPERATURE if body.temperature is None else body.temperature
    return SamplingParams(
        max_new_tokens=max_tokens,
        temperature=temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=None if body.top_k in (None, -1) else body.top_k,
        seed=body.seed,
        stop=body.stop_strings(),
        # Unary output omits the stop string; streamed output includes it (OVMS's
        # documented defaults).
        include_stop_str_in_output=body.stream,
        ignore_eos=body.ignore_eos,
    )
