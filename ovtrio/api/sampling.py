"""The one place that turns a validated request into SamplingParams.

A new sampling parameter touches its field in protocol/sampling_fields.py, this function, and
scheduler/params.py's to_generation_config.
"""

from __future__ import annotations

from typing import Any

from ovtrio.api.errors import invalid
from ovtrio.api.protocol import SamplingFields
from ovtrio.loading.limits import SequenceLimit, ServerDefaults
from ovtrio.loading.speculation import Speculation
from ovtrio.scheduler import OutputConstraint, SamplingParams, SpeculativeDecoding, check_params

# When multinomial sampling is on and the request names no top_k (OVMS's default).
DEFAULT_SAMPLING_TOP_K = 40


def _max_new_tokens(body: SamplingFields, prompt_tokens: int, limit: SequenceLimit, defaults: ServerDefaults) -> int:
    room = limit.tokens - prompt_tokens
    if room < 1:
        raise invalid(
            f"{limit.what} is {limit.tokens} tokens, but the prompt is {prompt_tokens} tokens."
            " Please shorten the prompt.",
            body.prompt_field,
            "context_length_exceeded",
        )
    max_tokens, param = body.requested_max_tokens()
    cap = defaults.max_tokens_limit
    if max_tokens is None:
        return min(room, cap) if cap else room
    if cap and max_tokens > cap:
        raise invalid(f"Invalid value for '{param}': this server allows at most {cap}.", param)
    if max_tokens > room:
        raise invalid(
            f"{limit.what} is {limit.tokens} tokens. However, you requested"
            f" {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} for the"
            f" completion). Please reduce the prompt or {param}.",
            param,
            "context_length_exceeded",
        )
    return max_tokens


# The setting that turns each speculative-decoding field on.
_ENABLED_BY = {
    "num_assistant_tokens": "--draft-model (speculative decoding) or --prompt-lookup (prompt lookup decoding)",
    "assistant_confidence_threshold": "--draft-model (speculative decoding with a draft model)",
    "max_ngram_size": "--prompt-lookup (prompt lookup decoding)",
}


def speculative_fields(body: SamplingFields, speculation: Speculation) -> dict[str, Any]:
    """The request's speculative-decoding settings, checked against how the server
    speculates, with the server's defaults for what it leaves out.

    A speculating pipeline speculates for every request (the engine refuses a request
    without these settings), so a request that sets none gets the defaults; greedy
    output is the main model's either way. The rules follow OVMS: prompt lookup takes
    num_assistant_tokens and max_ngram_size, a draft model num_assistant_tokens or
    assistant_confidence_threshold (not both, checked in protocol/sampling_fields.py).
    """
    sent = {name: value for name in _ENABLED_BY if (value := getattr(body, name)) is not None}
    if speculation.mode == "none":
        for name in sent:
            raise invalid(
                f"{name} needs speculative decoding, which this server does not run:"
                f" start it with {_ENABLED_BY[name]}.",
                name,
                "unsupported_parameter",
            )
        return {}
    if body.beam_width() > 1:
        raise invalid(
            "Beam search (best_of > 1) cannot be combined with speculative decoding, which this server runs for"
            " every request.",
            "best_of",
        )
    if speculation.mode == "prompt_lookup":
        if "assistant_confidence_threshold" in sent:
            raise invalid(
                "assistant_confidence_threshold applies to a draft model; this server speculates by prompt lookup"
                " (num_assistant_tokens, max_ngram_size).",
                "assistant_confidence_threshold",
                "unsupported_parameter",
            )
        return {
            "num_assistant_tokens": sent.get("num_assistant_tokens", speculation.num_assistant_tokens),
            "max_ngram_size": sent.get("max_ngram_size", speculation.max_ngram_size),
        }
    if "max_ngram_size" in sent:
        raise invalid(
            "max_ngram_size applies to prompt lookup decoding; this server speculates with a draft model"
            " (num_assistant_tokens or assistant_confidence_threshold).",
            "max_ngram_size",
            "unsupported_parameter",
        )
    if "num_assistant_tokens" in sent:
        return {"num_assistant_tokens": sent["num_assistant_tokens"]}
    if "assistant_confidence_threshold" in sent:
        return {"assistant_confidence_threshold": sent["assistant_confidence_threshold"]}
    return {
        "num_assistant_tokens": speculation.num_assistant_tokens,
        "assistant_confidence_threshold": speculation.assistant_confidence_threshold,
    }


def sampling_params(
    body: SamplingFields,
    prompt_tokens: int,
    limit: SequenceLimit,
    defaults: ServerDefaults = ServerDefaults(),
    constraint: OutputConstraint | None = None,
) -> SamplingParams:
    """Check the request against the limits and build its SamplingParams.

    `prompt_tokens` is the longest prompt of the request. Without max_tokens, generation
    may run to the end of the limit (or the server's max_tokens_limit), as with OpenAI.
    `constraint` is the output format the endpoint read from the request, if any.
    """
    nvext = body.nvext
    temperature = body.temperature if body.temperature is not None else defaults.get("temperature", 1.0)
    if nvext and nvext.greedy_sampling:
        temperature = 0.0
    top_k = body.effective_top_k()
    if top_k is None:
        top_k = defaults.get("top_k", DEFAULT_SAMPLING_TOP_K)
    repetition_penalty = body.repetition_penalty
    if nvext and nvext.repetition_penalty is not None:
        repetition_penalty = nvext.repetition_penalty
    ignore_eos = nvext.ignore_eos if nvext and nvext.ignore_eos is not None else body.ignore_eos
    include_stop = body.include_stop_str_in_output
    speculative = speculative_fields(body, defaults.speculation)
    max_new_tokens = _max_new_tokens(body, prompt_tokens, limit, defaults)
    if body.min_tokens > max_new_tokens:  # max_tokens omitted: the server's cap or the context's room
        raise invalid(
            f"Invalid value for 'min_tokens': this request may generate at most {max_new_tokens} tokens.",
            "min_tokens",
        )
    params = SamplingParams(
        max_new_tokens=max_new_tokens,
        n=body.n,
        best_of=body.beam_width(),
        temperature=temperature,
        top_p=body.top_p if body.top_p is not None else defaults.get("top_p", 1.0),
        top_k=None if top_k == -1 else top_k,
        min_p=body.min_p or 0.0,
        repetition_penalty=repetition_penalty
        if repetition_penalty is not None
        else defaults.get("repetition_penalty", 1.0),
        frequency_penalty=body.frequency_penalty or 0.0,
        presence_penalty=body.presence_penalty or 0.0,
        length_penalty=body.length_penalty,
        diversity_penalty=body.diversity_penalty or 0.0,
        seed=body.seed,
        stop=body.stop_strings(),
        stop_token_ids=tuple(body.stop_token_ids or ()),
        # Unary output omits the stop string by default, streamed output includes it
        # (OVMS's documented defaults).
        include_stop_str_in_output=body.stream if include_stop is None else include_stop,
        ignore_eos=ignore_eos,
        min_new_tokens=body.min_tokens,
        skip_special_tokens=body.skip_special_tokens,
        logprobs=body.wants_logprobs(),
        constraint=constraint,
        speculation=SpeculativeDecoding(**speculative),
    )
    if max_new_tokens > 0:  # max_tokens 0 (scoring, echo) never reaches the engine
        check_params(params)  # UnsupportedParams: the engine refuses the combination
    return params
