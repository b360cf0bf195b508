"""The layout keeps its promises, read from the source (every import, including those
inside functions):

* packages depend on each other one way only: no import cycle between ovtrio's
  packages and top-level modules;
* the API layer never touches the engine (no openvino, no openvino_genai);
* the scheduler knows nothing of the API layer.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "ovtrio"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Each ovtrio module and the absolute names it imports."""
    found: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
        found[_module_name(path)] = names
    return found


IMPORTS = _imports()


def _unit(module: str) -> str | None:
    """The package or top-level module that `module` belongs to: ovtrio.api.chat.routes
    -> ovtrio.api, ovtrio.serving.service -> ovtrio.serving.service."""
    parts = module.split(".")
    if parts[0] != "ovtrio" or len(parts) < 2:
        return None
    return ".".join(parts[:2])


def _graph() -> dict[str, set[str]]:
    known = {_unit(module) for module in IMPORTS} - {None}
    graph: dict[str, set[str]] = defaultdict(set)
    for module, names in IMPORTS.items():
        source = _unit(module)
        for name in names:
            target = _unit(name)
            if source and target in known and target != source:
                graph[source].add(target)
    return graph


def test_no_import_cycle_between_packages():
    graph = _graph()
    done: set[str] = set()

    def visit(unit: str, path: list[str]) -> None:
        if unit in path:
            pytest.fail("import cycle: " + " -> ".join(path[path.index(unit) :] + [unit]))
        if unit in done:
            return
        for target in sorted(graph.get(unit, ())):
            visit(target, [*path, unit])
        done.add(unit)

    for unit in sorted(graph):
        visit(unit, [])


def _modules_under(package: str) -> dict[str, set[str]]:
    return {m: names for m, names in IMPORTS.items() if m == package or m.startswith(package + ".")}


def test_the_api_layer_does_not_import_the_engine():
    offenders = {
        module: sorted(n for n in names if n.split(".")[0] in ("openvino", "openvino_genai"))
        for module, names in _modules_under("ovtrio.api").items()
    }
    assert {m: n for m, n in offenders.items() if n} == {}


def test_the_scheduler_does_not_import_the_api_layer():
    offenders = {
        module: sorted(n for n in names if _unit(n) == "ovtrio.api")
        for module, names in _modules_under("ovtrio.scheduler").items()
    }
    assert {m: n for m, n in offenders.items() if n} == {}


def test_the_checks_see_the_packages():
    """Guards the checks above against reading nothing."""
    graph = _graph()
    assert {"ovtrio.api", "ovtrio.scheduler", "ovtrio.model", "ovtrio.parsing", "ovtrio.output"} <= set(graph) | {
        t for targets in graph.values() for t in targets
    }
    assert "ovtrio.scheduler" in graph["ovtrio.api"]
