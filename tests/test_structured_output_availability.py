"""/v1/models tells whether each model's output can be constrained (response_format,
forced tool calls) before a client sends one: without the XGrammar the engine compiles
with, every constraint is refused, and the card says so with how to install it. In
process: the routes only read the registry (nothing is loaded)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ovtrio.constraints.check import structured_output_missing
from ovtrio.settings.server import Settings


@pytest.fixture
def fresh_check() -> Iterator[None]:
    structured_output_missing.cache_clear()
    yield
    structured_output_missing.cache_clear()


async def cards(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    from ovtrio.api.context import registry_of
    from ovtrio.server.app import create_app

    logger = logging.getLogger("ovtrio")  # the app sets up its own log; put it back afterwards
    for name in ("handlers", "propagate", "level"):
        monkeypatch.setattr(logger, name, list(logger.handlers) if name == "handlers" else getattr(logger, name))
    app = create_app(Settings())
    registry_of(app).check()  # resolves the embedded model's path and name, loads nothing
    reply = await app.test_client().get("/v1/models")
    assert reply.status_code == 200
    return [card for card in (await reply.get_json())["data"] if card["kind"] == "generation"]


async def test_the_model_card_says_structured_output_is_available(monkeypatch, fresh_check):
    listed = await cards(monkeypatch)
    assert listed and all(card["structured_output"] == {"available": True} for card in listed)


async def test_without_xgrammar_the_model_card_says_why_and_how_to_install_it(monkeypatch, tmp_path: Path, fresh_check):
    # A distribution of another version first on the path: as without one (what the
    # grammar worker finds too, tests/test_grammar_check.py).
    metadata = tmp_path / "xgrammar-0.0.1.dist-info"
    metadata.mkdir()
    (metadata / "METADATA").write_text("Metadata-Version: 2.1\nName: xgrammar\nVersion: 0.0.1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    listed = await cards(monkeypatch)
    assert listed
    for card in listed:
        assert card["structured_output"]["available"] is False
        assert "pip install --no-deps xgrammar==0.1.31" in card["structured_output"]["reason"]
