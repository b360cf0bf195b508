"""The settings model: one model's settings and the server's, combined; the OVTRIO_*
variables read through pydantic-settings; a config file's entry validated as one model's
settings."""

from __future__ import annotations

import json

import pytest

from ovtrio.settings.config_file import model_settings
from ovtrio.settings.model import PER_MODEL_SETTINGS, ModelSettings
from ovtrio.settings.server import ServerSettings, Settings, SettingsError, settings_from_env


def test_settings_are_one_models_and_the_servers():
    model, server = set(ModelSettings.model_fields), set(ServerSettings.model_fields)
    assert not model & server
    assert set(Settings.model_fields) == model | server
    assert tuple(ModelSettings.model_fields) == PER_MODEL_SETTINGS
    assert {"max_num_seqs", "plugin_config", "model"} <= model
    assert {"port", "api_key", "config", "cache_dir"} <= server
    assert Settings(max_num_seqs=8, port=0).max_num_seqs == 8


def test_variables_hold_one_value_each_as_written():
    settings = settings_from_env(
        {
            "OVTRIO_API_KEY": "one,key",  # one key, commas and all
            "OVTRIO_ALLOWED_HOSTS": "a.example, b.example:81",  # split by the setting itself
            "OVTRIO_PLUGIN_CONFIG": '{"A": 1}',
            "OVTRIO_MODEL_CACHE": "false",
            "OVTRIO_MAX_NUM_SEQS": "",  # empty: unset
            "OVTRIO_NO_SUCH_SETTING": "1",
            "OTHER_MAX_NUM_SEQS": "3",
            "ovtrio_max_num_seqs": "3",  # the variables are spelled in upper case
            "OVTRIO_max_num_seqs": "3",
        }
    )
    assert settings.api_key == ["one,key"]
    assert settings.allowed_hosts == ["a.example", "b.example:81"]
    assert settings.plugin_config == {"A": 1}
    assert settings.model_cache is False
    assert settings.max_num_seqs == Settings.model_fields["max_num_seqs"].default


def test_flags_win_over_variables():
    settings = settings_from_env({"OVTRIO_MAX_NUM_SEQS": "4", "OVTRIO_API_KEY": "k"}, max_num_seqs="8", api_key=None)
    assert settings.max_num_seqs == 8
    assert settings.api_key == ["k"]


def test_a_bad_variable_is_named_with_its_flag():
    with pytest.raises(SettingsError) as refused:
        settings_from_env({"OVTRIO_PLUGIN_CONFIG": "{not json"})
    assert str(refused.value).startswith("invalid setting plugin_config (OVTRIO_PLUGIN_CONFIG / --plugin-config): ")
    assert "not JSON" in str(refused.value)


def test_a_config_entry_is_checked_as_one_models_settings(tmp_path):
    """An entry's plugin_config gets the setting's own checks, in one line naming the entry
    (not a traceback from validating the merged settings)."""
    config = tmp_path / "models.json"
    config.write_text(
        json.dumps({"models": [{"served_model_name": "a", "plugin_config": {"INFERENCE_PRECISION_HINT": "f32"}}]})
    )
    with pytest.raises(SettingsError) as refused:
        model_settings(Settings(config=str(config)))
    message = str(refused.value)
    assert "models[0] ('a'): plugin_config:" in message
    assert "INFERENCE_PRECISION_HINT is set with --inference-precision" in message
