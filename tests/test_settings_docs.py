"""docs/configuration.md is what scripts/settings_docs.py writes from the settings model,
so the page lists every setting as the server reads it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ovtrio.settings.model import ModelSettings
from ovtrio.settings.server import ServerSettings

ROOT = Path(__file__).resolve().parents[1]


def _generator():
    spec = importlib.util.spec_from_file_location("settings_docs", ROOT / "scripts" / "settings_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_page_is_the_generators_output():
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == _generator().render(), "out of date: run python scripts/settings_docs.py"


def test_every_setting_is_listed_once_in_its_group():
    page = _generator().render()
    model_part, server_part = page.split("\n## Server settings\n")
    model_part = model_part.split("\n## Model settings\n")[1]
    for fields, part, other in (
        (ModelSettings.model_fields, model_part, server_part),
        (ServerSettings.model_fields, server_part, model_part),
    ):
        for name in fields:
            row = f"| `{name}` | `--{name.replace('_', '-')}"
            assert part.count(row) == 1, name
            assert row not in other, name
            assert f"`OVTRIO_{name.upper()}`" in part, name


def test_descriptions_cannot_break_the_table():
    """A description's `|` stays in its cell and its `<think>` shows as text, not HTML."""
    generator = _generator()
    assert generator.markdown_text("a | b <think> '*' c") == "a \\| b &lt;think&gt; '\\*' c"
    assert "&lt;think&gt;" in generator.render()
