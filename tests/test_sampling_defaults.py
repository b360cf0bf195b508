"""Pure logic of sampling_params: where each setting comes from when the client is silent."""

from __future__ import annotations

import pytest

from ovtrio.api.errors import APIError
from ovtrio.api.protocol import ChatCompletionRequest, CompletionRequest
from ovtrio.api.sampling import DEFAULT_SAMPLING_TOP_K, sampling_params
from ovtrio.loading.limits import SequenceLimit, ServerDefaults

LIMIT = SequenceLimit(8192, "This model's maximum context length")
MODEL_DEFAULTS = ServerDefaults({"temperature": 0.3, "top_p": 0.8, "top_k": 7, "repetition_penalty": 1.05})


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], **fields}
    )


def test_openai_defaults_without_a_generation_config():
    params = sampling_params(chat(), 10, LIMIT)
    assert (params.temperature, params.top_p, params.top_k) == (1.0, 1.0, DEFAULT_SAMPLING_TOP_K)
    assert params.max_new_tokens == 8192 - 10
    assert params.include_stop_str_in_output is False


def test_generation_config_supplies_defaults_and_the_request_wins():
    silent = sampling_params(chat(), 10, LIMIT, MODEL_DEFAULTS)
    assert (silent.temperature, silent.top_p, silent.top_k, silent.repetition_penalty) == (0.3, 0.8, 7, 1.05)
    explicit = sampling_params(
        chat(temperature=0.9, top_p=0.5, top_k=-1, repetition_penalty=1.0), 10, LIMIT, MODEL_DEFAULTS
    )
    assert (explicit.temperature, explicit.top_p, explicit.top_k, explicit.repetition_penalty) == (0.9, 0.5, None, 1.0)


def test_max_tokens_limit_is_default_and_cap():
    capped = ServerDefaults(max_tokens_limit=50)
    assert sampling_params(chat(), 10, LIMIT, capped).max_new_tokens == 50
    assert sampling_params(chat(max_tokens=20), 10, LIMIT, capped).max_new_tokens == 20
    with pytest.raises(APIError) as refused:
        sampling_params(chat(max_tokens=51), 10, LIMIT, capped)
    assert refused.value.param == "max_tokens"


def test_streaming_includes_stop_strings_by_default():
    params = sampling_params(chat(stream=True, stop="x"), 10, LIMIT)
    assert params.include_stop_str_in_output is True


def test_nvext_overrides_top_level_fields():
    params = sampling_params(
        chat(
            temperature=1.2, top_k=3, ignore_eos=False, nvext={"greedy_sampling": True, "top_k": 9, "ignore_eos": True}
        ),
        10,
        LIMIT,
    )
    assert (params.temperature, params.top_k, params.ignore_eos) == (0.0, 9, True)


def test_completion_logprobs_zero_still_asks_for_logprobs():
    body = CompletionRequest.model_validate({"model": "m", "prompt": "x", "logprobs": 0})
    assert sampling_params(body, 3, LIMIT).logprobs is True


@pytest.mark.parametrize("penalty", [0.0, 1.5])
def test_beam_penalties_reach_the_engine_config(penalty):
    """What the server tests cannot see in a 135M model's beams: the penalties land in
    the engine's GenerationConfig (group beam search, one beam per group, when diverse)."""
    from ovtrio.scheduler.params import to_generation_config

    params = sampling_params(
        chat(temperature=0, n=2, best_of=3, length_penalty=0.5, diversity_penalty=penalty), 10, LIMIT
    )
    config = to_generation_config(params, seed_offset=0, model_stop_token_ids=frozenset({2}))
    assert config.num_beams == 3 and config.num_return_sequences == 2
    assert config.length_penalty == 0.5
    if penalty:
        assert config.num_beam_groups == 3 and config.diversity_penalty == penalty
    else:
        assert config.num_beam_groups == 1
