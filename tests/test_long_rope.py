"""LongRoPE models (Phi-3 and Phi-3.5 of 128k context, Phi-4-mini) are found from their
config.json, and their engine is set up to prefill prompts past the original context in
one step (ovtrio/model/long_rope.py; the scheduler's side is in test_prefill_slices.py).
Pure logic; test_long_rope_server.py serves such a model."""

from __future__ import annotations

import json

import pytest

from ovtrio.model.long_rope import original_context, whole_prompt_settings
from ovtrio.model.source import resolve_model
from ovtrio.settings.server import Settings

PHI3_128K = {
    "model_type": "phi3",
    "max_position_embeddings": 131072,
    "original_max_position_embeddings": 4096,
    "rope_scaling": {"type": "longrope", "long_factor": [1.0, 1.2], "short_factor": [1.0, 1.0]},
}
# Phi-4-mini as a newer transformers writes it.
PHI4_MINI = {
    "model_type": "phi3",
    "max_position_embeddings": 131072,
    "rope_parameters": {"rope_type": "longrope", "original_max_position_embeddings": 4096, "long_factor": [1.0]},
}


@pytest.mark.parametrize(
    "config, expected",
    [
        (PHI3_128K, 4096),
        (PHI4_MINI, 4096),
        ({**PHI3_128K, "rope_scaling": None, "max_position_embeddings": 4096}, None),  # Phi-3 4k
        ({**PHI3_128K, "max_position_embeddings": 4096}, None),  # its context never goes past it
        ({"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, None),
        ({"max_position_embeddings": 131072, "rope_scaling": {"type": "longrope"}}, None),  # no original context
        ({"max_position_embeddings": 8192}, None),
    ],
)
def test_a_longrope_model_is_found_with_its_original_context(config, expected):
    assert original_context(config, config["max_position_embeddings"]) == expected


def test_an_ir_folder_of_a_longrope_model_says_so(tmp_path):
    (tmp_path / "openvino_model.xml").write_text("<net/>")
    (tmp_path / "config.json").write_text(json.dumps(PHI3_128K))
    source = resolve_model(Settings(model=str(tmp_path)))
    assert (source.context_length, source.short_rope_context) == (131072, 4096)
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    assert resolve_model(Settings(model=str(tmp_path))).short_rope_context is None


def test_its_engine_holds_its_longest_prompt_in_one_step_without_the_prefix_cache(tmp_path):
    (tmp_path / "openvino_model.xml").write_text("<net/>")
    (tmp_path / "config.json").write_text(json.dumps(PHI3_128K))
    settings = Settings(model=str(tmp_path), max_num_seqs=8)
    adjusted = whole_prompt_settings(resolve_model(settings), settings)
    assert adjusted.max_num_batched_tokens == 131072 + 8
    assert adjusted.enable_prefix_caching is False
    # Any other model keeps its settings.
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    assert whole_prompt_settings(resolve_model(settings), settings) is settings
