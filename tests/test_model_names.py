"""A model's name is its id: clients send it back, /v1/models lists it, /metrics puts it
in a label. A file of --models-dir whose name is not UTF-8 text can be none of these:
it is not served, and the log says so once. Any name that is text is served as it is,
odd characters and all.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

import loopback
from ovtrio.model import ModelLoadError, embedded_model_path, resolve_model
from ovtrio.serving.discovery import folder_models
from ovtrio.settings.server import Settings
from test_models_on_demand import serve_on_demand, states_folder, unload

__all__ = ["serve_on_demand"]  # the server these tests share with test_models_on_demand

NOT_UTF8 = b"caf\xe9.gguf"
# Spaces, quotes, a backslash, accents, a character beyond the BMP and a newline.
ODD = 'odd "name" \\ caf\u00e9 \U0001f600\nline'


def test_a_file_whose_name_is_not_utf8_is_skipped_with_one_warning(tmp_path, caplog):
    os.symlink(embedded_model_path(), os.path.join(os.fsencode(tmp_path), NOT_UTF8))
    (tmp_path / "plain.gguf").symlink_to(embedded_model_path())
    with caplog.at_level(logging.WARNING, logger="ovtrio"):
        for _ in range(3):  # the folder is read at every listing
            assert [model.name for model in folder_models(tmp_path)] == ["plain"]
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and "caf\\xe9.gguf" in warnings[0], warnings


def test_a_model_named_after_a_path_that_is_not_utf8_is_refused_at_start(tmp_path):
    path = os.path.join(os.fsencode(tmp_path), NOT_UTF8)
    os.symlink(embedded_model_path(), path)
    with pytest.raises(ModelLoadError, match=r"caf\\xe9.*served_model_name"):
        resolve_model(Settings(model=os.fsdecode(path)))
    # Named otherwise, the same file serves.
    assert resolve_model(Settings(model=os.fsdecode(path), served_model_name="cafe")).name == "cafe"


def test_a_folder_entry_whose_name_is_not_utf8_leaves_the_list_and_metrics_whole(serve_on_demand):
    server = serve_on_demand
    entry = os.path.join(os.fsencode(states_folder(server)), NOT_UTF8)
    os.symlink(embedded_model_path(), entry)
    try:
        listed = loopback.get(server.base_url + "/v1/models", timeout=30)
        assert listed.status_code == 200
        ids = [model["id"] for model in listed.json()["data"]]
        assert "alpha" in ids and not [name for name in ids if name.startswith("caf")], ids
        scrape = loopback.get(server.base_url + "/metrics", timeout=30)
        assert scrape.status_code == 200, scrape.text
        log = server.log_path.read_text(errors="replace")
        assert log.count("not serving 'caf\\xe9.gguf'") == 1
    finally:
        os.unlink(entry)


def test_a_name_with_odd_characters_is_served_listed_and_labelled_as_it_is(serve_on_demand):
    server = serve_on_demand
    added = Path(states_folder(server)) / f"{ODD}.gguf"
    added.unlink(missing_ok=True)
    added.symlink_to(embedded_model_path())
    try:
        client = openai.OpenAI(base_url=server.v1, api_key="none", max_retries=0)
        assert ODD in [model.id for model in client.models.list()]
        assert client.models.retrieve(ODD).id == ODD
        reply = client.chat.completions.create(
            model=ODD, messages=[{"role": "user", "content": "Hi"}], max_tokens=2, extra_body={"ignore_eos": True}
        )
        assert reply.model == ODD and reply.usage is not None and reply.usage.completion_tokens == 2
        # The exposition escapes the label, and a parser reads the name back whole.
        exposition = loopback.get(server.base_url + "/metrics", timeout=30).text
        generated = [
            sample.value
            for family in text_string_to_metric_families(exposition)
            for sample in family.samples
            if sample.name == "ovtrio_generated_tokens_total" and sample.labels["model_name"] == ODD
        ]
        assert generated == [2]
    finally:
        assert unload(server, ODD).status_code == 200
        added.unlink()
