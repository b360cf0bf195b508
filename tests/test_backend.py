"""Choosing the engine backend and what follows from it (ovtrio/engine/backend.py), and
the API's refusals of what a backend cannot do (ovtrio/api/capabilities.py): pure logic,
no engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from ovtrio.api.capabilities import check_capabilities, check_constraint, check_prompt_length
from ovtrio.api.errors import APIError
from ovtrio.api.protocol import ChatCompletionRequest
from ovtrio.engine.backend import backend_conflict, capabilities_for, engine_backend, stateful_properties
from ovtrio.loading.limits import sequence_limit, work_limits
from ovtrio.model.source import ModelSource
from ovtrio.scheduler import OutputConstraint
from ovtrio.settings.server import Settings


def test_auto_picks_stateful_on_npu_only():
    assert engine_backend(Settings(device="NPU")) == "stateful"
    assert engine_backend(Settings(device="CPU")) == "continuous_batching"
    assert engine_backend(Settings(device="GPU.1")) == "continuous_batching"
    assert engine_backend(Settings(device="CPU", backend="stateful")) == "stateful"


def test_the_npu_gets_ovms_compile_lengths_and_other_devices_the_stateful_attention():
    assert stateful_properties(Settings(device="NPU")) == {"MAX_PROMPT_LEN": 1024, "MIN_RESPONSE_LEN": 128}
    assert stateful_properties(Settings(device="NPU", max_prompt_len=2048, min_response_len=256)) == {
        "MAX_PROMPT_LEN": 2048,
        "MIN_RESPONSE_LEN": 256,
    }
    assert stateful_properties(Settings(device="CPU", backend="stateful")) == {"ATTENTION_BACKEND": "SDPA"}


def test_the_npu_context_is_prompt_plus_response_length():
    source = ModelSource(Path("m"), "openvino-ir", "m", 8192, {}, None)
    assert sequence_limit(source, 0, Settings(device="NPU", max_prompt_len=512)).tokens == 512 + 128
    assert sequence_limit(source, 0, Settings(device="CPU", backend="stateful")).tokens == 8192
    assert work_limits(Settings(device="NPU"), 0).running_sequences == 1


def test_settings_the_backend_cannot_run_are_named():
    assert "--prompt-lookup" in backend_conflict(Settings(backend="stateful", prompt_lookup=True))
    assert "--draft-model" in backend_conflict(Settings(device="NPU", draft_model="draft"))
    assert "stateful" in backend_conflict(Settings(device="NPU", backend="continuous_batching"))
    assert backend_conflict(Settings(prompt_lookup=True)) is None


def refused(check, *args) -> APIError:
    with pytest.raises(APIError) as caught:
        check(*args)
    assert caught.value.status == 400
    return caught.value


def chat_request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    )


def test_the_continuous_backend_refuses_nothing_of_this():
    capabilities = capabilities_for(Settings())
    check_capabilities(capabilities, chat_request(n=2, best_of=3, logprobs=True), 1)
    check_constraint(capabilities, chat_request(), OutputConstraint(json_schema="{}"))
    check_prompt_length(capabilities, chat_request(), [[1] * 100_000])


def test_the_stateful_backend_refuses_by_field():
    capabilities = capabilities_for(Settings(backend="stateful", max_prompt_len=10))
    assert refused(check_capabilities, capabilities, chat_request(n=2), 1).param == "n"
    assert refused(check_capabilities, capabilities, chat_request(best_of=2), 1).param == "best_of"
    assert refused(check_capabilities, capabilities, chat_request(logprobs=True), 1).param == "logprobs"
    too_long = refused(check_prompt_length, capabilities, chat_request(), [[1] * 11])
    assert (too_long.param, too_long.code) == ("messages", "context_length_exceeded")
    assert "10" in too_long.message and "--max-prompt-len" in too_long.message
    check_prompt_length(capabilities, chat_request(), [[1] * 10])
    check_constraint(capabilities, chat_request(), OutputConstraint(json_schema="{}"))  # it runs constrained decoding


def test_a_backend_without_constrained_decoding_names_the_field_that_asked_for_it():
    from dataclasses import replace

    capabilities = replace(capabilities_for(Settings(backend="stateful")), structured_output=False)
    body = chat_request(response_format={"type": "json_object"})
    assert refused(check_constraint, capabilities, body, OutputConstraint(json_schema="{}")).param == "response_format"
    check_constraint(capabilities, body, None)


def test_the_thread_count_reaches_the_cpu_only():
    from ovtrio.loading.load import engine_properties

    assert "INFERENCE_NUM_THREADS" not in engine_properties(Settings())
    assert engine_properties(Settings(num_threads=1))["INFERENCE_NUM_THREADS"] == "1"
    assert "INFERENCE_NUM_THREADS" not in engine_properties(Settings(device="GPU", num_threads=1))
    with pytest.raises(ValueError):
        Settings(num_threads=0)


def test_plugin_config_reaches_the_engine_and_leaves_owned_properties_to_their_settings():
    from ovtrio.loading.load import engine_properties
    from ovtrio.settings.server import SettingsError, settings_from_env

    settings = settings_from_env({"OVTRIO_PLUGIN_CONFIG": '{"DYNAMIC_QUANTIZATION_GROUP_SIZE": 0, "X": "y"}'})
    assert settings.plugin_config == {"DYNAMIC_QUANTIZATION_GROUP_SIZE": 0, "X": "y"}
    properties = engine_properties(settings.model_copy(update={"inference_precision": "f32"}))
    assert properties == {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0, "X": "y"}
    # A config file gives the object itself.
    assert Settings(plugin_config={"A": True}).plugin_config == {"A": True}
    for bad, words in (
        ("[1]", "valid dictionary"),
        ('{"A": [1]}', "A: a property's value is a string, a number or a boolean"),
        ('{"KV_CACHE_PRECISION": "f32"}', "--kv-cache-precision"),
        ('{"INFERENCE_NUM_THREADS": 1}', "--num-threads"),
    ):
        with pytest.raises(SettingsError, match="plugin_config") as refused:
            settings_from_env({}, plugin_config=bad)
        assert words in str(refused.value)
