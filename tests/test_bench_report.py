"""The benchmark docs hold together: docs/benchmarks.md's tables and the README's speed
figures are what `python -m bench report` writes from bench/results/, every scenario
with results has its table, and the CLI lists every scenario and gives each one's
options. In process, no server: the scenarios' modules are imported, none is run."""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import report, scenarios  # noqa: E402
from bench.__main__ import main  # noqa: E402
from bench.driver import results  # noqa: E402


@pytest.mark.parametrize("page", [report.DOCS, report.README], ids=lambda page: page.name)
def test_generated_sections_are_what_the_results_give(page):
    expected = report.pages()[page]
    assert page.read_text(encoding="utf-8") == expected, (
        f"{page.name} differs from the results: run `python -m bench report`"
    )


def test_the_pages_have_generated_sections():
    assert report.SECTION.search(report.README.read_text(encoding="utf-8")), "the README has no speed figures"
    assert len(report.SECTION.findall(report.DOCS.read_text(encoding="utf-8"))) >= len(scenarios.NAMES)


def test_every_scenario_with_results_has_a_table():
    assert report.unplaced() == []


def test_every_scenario_has_a_table():
    tables = set(report.SECTION_NAMES.findall(report.DOCS.read_text(encoding="utf-8")))
    assert set(scenarios.NAMES) <= tables


def cli_help(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        main([*argv, "--help"])
    assert exited.value.code == 0
    return out.getvalue()


def test_help_lists_every_scenario_and_report():
    text = cli_help()
    for name in (*scenarios.NAMES, "report"):
        assert f"    {name}" in text, name


@pytest.mark.parametrize("name", scenarios.NAMES)
def test_each_scenario_gives_its_options(name):
    text = cli_help(name)
    assert f"python -m bench {name}" in text
    assert "--no-save" in text and "--conditions" in text


def result(time: str, conditions: str) -> dict:
    machine = {"label": "a machine"}
    return {"scenario": "serving", "time": time, "conditions": conditions, "machine": machine, "summary": {}}


def test_a_quiet_result_shows_beside_a_busy_one_only_when_the_busy_one_came_after():
    quiet, busy = result("2026-01-01T00:00:00Z", "quiet"), result("2026-01-02T00:00:00Z", "busy machine")
    assert results.latest([quiet, busy], quiet_apart=True)["serving"] == {"a machine": busy, "a machine (quiet)": quiet}
    newer_quiet = result("2026-01-03T00:00:00Z", "quiet")
    assert results.latest([quiet, busy, newer_quiet], quiet_apart=True)["serving"] == {"a machine (quiet)": newer_quiet}


def test_the_plot_is_drawn_from_the_newest_peer_result():
    newest = report.plotted(results.latest(results.load_all()))
    assert newest is not None
    assert report.drawn_from() == report.source(newest), "docs/peer.png is stale: run `python -m bench report`"
