"""The layout keeps its promises, read from the source (every import, including those
inside functions):

* ovtrio's packages (and its few top-level modules) sit in layers, and each imports only
  from the layers below it (LAYERS): so no import cycle, nothing but the entry points
  imports the server, the scheduler imports nothing of serving or of the API, and the
  settings import no other ovtrio package;
* only the packages that drive the engine import OpenVINO; only the HTTP layers import
  the web frameworks; only the server imports Hypercorn;
* an error that names a request field is a FieldError, which the API layer answers
  alike;
* modules stay small: a few at the top of `ovtrio/`, none over MAX_LINES lines but the
  few in LONGER_MODULES, where splitting would scatter one concept.
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


SOURCES = {_module_name(path): path for path in ROOT.rglob("*.py")}
TREES = {module: ast.parse(path.read_text(encoding="utf-8")) for module, path in SOURCES.items()}


def _imports() -> dict[str, set[str]]:
    """Each ovtrio module and the absolute names it imports."""
    found: dict[str, set[str]] = {}
    for module, tree in TREES.items():
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
        found[module] = names
    return found


IMPORTS = _imports()


def _unit(module: str) -> str | None:
    """The package or top-level module that `module` belongs to: ovtrio.api.chat.routes
    -> ovtrio.api, ovtrio.serving.service -> ovtrio.serving, ovtrio.app -> ovtrio.app."""
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


# From the top down; a unit imports only from the layers below its own (not from one
# beside it). A new package or top-level module takes its place here.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("ovtrio.app", "ovtrio.__main__"),  # the entry points: the ASGI app, `python -m ovtrio`
    ("ovtrio.server",),  # the app factory, the CLI, logs, Hypercorn's config and patches
    ("ovtrio.api", "ovtrio.playground"),  # HTTP and WebSocket: the OpenAI API, the browser page
    ("ovtrio.serving",),  # the served models: service, registry, shutdown, metrics, memory
    ("ovtrio.audio", "ovtrio.speech"),  # speech in (Whisper) and out (SpeechT5), on the encoders' worker
    ("ovtrio.embedding", "ovtrio.scoring", "ovtrio.images", "ovtrio.output"),
    ("ovtrio.lifecycle",),  # what every served model's lifecycle shares: its leases, the load retry
    ("ovtrio.scheduler",),  # the engine's one owner; knows nothing of HTTP
    ("ovtrio.loading",),  # a model's load into the engine, and what a request may ask of it
    ("ovtrio.model", "ovtrio.text"),  # finding and checking the model; its text: prompts, vocabulary
    ("ovtrio.gguf", "ovtrio.constraints"),  # the GGUF file and what is built from it; output constraints
    ("ovtrio.engine",),  # what drives OpenVINO: the backend, the binding, token tensors, errors' words
    # They import no other ovtrio package.
    ("ovtrio.parsing", "ovtrio.settings", "ovtrio.errors", "ovtrio.seams", "ovtrio.files"),
)
LAYER = {unit: depth for depth, units in enumerate(LAYERS) for unit in units}


def test_every_package_has_its_layer():
    units = {_unit(module) for module in IMPORTS} - {None}
    assert units == set(LAYER), "place new packages in LAYERS, remove gone ones"


def test_each_layer_imports_only_from_the_layers_below():
    offenders = sorted(
        f"{module} imports {name}"
        for module, names in IMPORTS.items()
        for name in names
        if (source := _unit(module)) in LAYER
        and (target := _unit(name)) in LAYER
        and target != source
        and LAYER[target] <= LAYER[source]
    )
    assert offenders == []


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


def test_only_the_entry_points_import_the_server():
    importers = {_unit(m) for m, names in IMPORTS.items() for n in names if _unit(n) == "ovtrio.server"}
    assert importers - {"ovtrio.server"} == {"ovtrio.app", "ovtrio.__main__"}


def test_the_settings_import_no_other_ovtrio_package():
    assert _graph().get("ovtrio.settings", set()) == set()


def _units_importing(libraries: set[str]) -> dict[str, list[str]]:
    """The units that import any of `libraries`, each with the modules that do."""
    found: dict[str, list[str]] = defaultdict(list)
    for module, names in IMPORTS.items():
        if any(name.split(".")[0] in libraries for name in names):
            found[_unit(module) or module].append(module)
    return found


# The units that drive the engine, each with the modules allowed to import OpenVINO (None:
# any of them).
OPENVINO_IMPORTERS: dict[str, set[str] | None] = {
    "ovtrio.scheduler": None,
    "ovtrio.embedding": None,
    "ovtrio.scoring": None,
    "ovtrio.audio": None,
    "ovtrio.speech": None,
    "ovtrio.loading": None,
    "ovtrio.engine": None,
    "ovtrio.gguf": None,  # the builder makes OpenVINO graphs and tokenizers
    # The device check asks OpenVINO which devices exist; a VLM's image cost is measured
    # with its vision encoder.
    "ovtrio.model": {"ovtrio.model.devices", "ovtrio.model.vision"},
    # Client text is tokenized as text through the tokenizer's own graph.
    "ovtrio.text": {"ovtrio.text.plain_text"},
    # The bound on the engine's cache of compiled grammars patches OpenVINO GenAI's library.
    "ovtrio.constraints": {"ovtrio.constraints.cache"},
}


def test_only_the_engine_packages_import_openvino():
    """The API layer, serving and the server reach the engine only through the scheduler,
    the load and the encoders; below them, only the modules named import it."""
    importers = _units_importing({"openvino", "openvino_genai", "openvino_tokenizers"})
    outside = {
        unit: sorted(set(modules) - allowed)
        for unit, modules in importers.items()
        if (allowed := OPENVINO_IMPORTERS.get(unit, set())) is not None and not set(modules) <= allowed
    }
    assert outside == {}
    named = {unit: modules for unit, modules in OPENVINO_IMPORTERS.items() if modules is not None}
    assert {unit: set(importers.get(unit, [])) for unit in named} == named  # the names stay true
    assert {"ovtrio.loading", "ovtrio.engine", "ovtrio.scheduler"} <= set(importers)  # the check reads something


def test_only_the_http_layers_import_the_web_frameworks():
    """Below the API layer (serving, the scheduler, the model...) nothing speaks HTTP."""
    importers = _units_importing({"quart", "quart_trio", "werkzeug", "hypercorn", "h11", "wsproto"})
    allowed = {"ovtrio.app", "ovtrio.server", "ovtrio.api", "ovtrio.playground"}
    assert {unit: modules for unit, modules in importers.items() if unit not in allowed} == {}
    assert {"ovtrio.server", "ovtrio.api"} <= set(importers)


def test_only_the_server_imports_hypercorn():
    importers = _units_importing({"hypercorn"})
    assert set(importers) == {"ovtrio.server"}


def test_an_error_naming_a_request_field_is_a_field_error():
    """An exception class that carries a `param` derives from ovtrio.errors.FieldError, so
    the API layer answers it as a 400 naming the field (APIError, the answer itself,
    excepted)."""
    classes: dict[str, ast.ClassDef] = {}
    for tree in TREES.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes[node.name] = node

    def bases(node: ast.ClassDef) -> set[str]:
        return {
            b.id if isinstance(b, ast.Name) else b.attr for b in node.bases if isinstance(b, ast.Name | ast.Attribute)
        }

    def is_field_error(name: str) -> bool:
        return name == "FieldError" or (
            name in classes and any(is_field_error(b) for b in bases(classes[name]) - {name})
        )

    def sets_param(node: ast.ClassDef) -> bool:
        return any(
            isinstance(target, ast.Attribute) and target.attr == "param"
            for assign in ast.walk(node)
            if isinstance(assign, ast.Assign | ast.AnnAssign)
            for target in (assign.targets if isinstance(assign, ast.Assign) else [assign.target])
        )

    carriers = {name for name, node in classes.items() if sets_param(node)} - {"FieldError", "APIError"}
    field_errors = {name for name in classes if is_field_error(name)} - {"FieldError"}
    assert {name for name in carriers if not is_field_error(name)} == set()
    assert {"PromptError", "ImageError", "ConstraintError", "UnsupportedParams", "InputError"} <= field_errors


# Modules directly in ovtrio/: the package, `python -m ovtrio`, the ASGI entry point and
# the error every layer shares. Everything else lives in a package.
MAX_TOP_LEVEL_MODULES = 5
MAX_LINES = 400
# The modules allowed past MAX_LINES, each up to its own cap, and why it stays whole.
LONGER_MODULES: dict[str, tuple[int, str]] = {
    "scheduler/scheduler.py": (
        450,
        "the continuous-batching loop beside the rule it keeps: which engine call is made"
        " from which thread, and when (its docstring), which every method of the loop applies",
    ),
    "scheduler/engine_admission.py": (
        450,
        "every way a queued request becomes engine requests between two steps (whole, with"
        " images from a worker thread, as a long prompt's slices), which share one engine"
        " call and its refusals",
    ),
    "serving/residency.py": (
        450,
        "every way a model comes and goes (a load, an unload by hand, when idle, to make"
        " room), for generation models and encoders, under one load turn whose rules each"
        " of them keeps",
    ),
}


def test_few_modules_at_the_top_of_the_package():
    top = sorted(path.name for path in ROOT.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


def _lines() -> dict[str, int]:
    return {
        path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in SOURCES.values()
    }


def test_no_module_over_the_line_limit():
    over = {name: count for name, count in _lines().items() if count > LONGER_MODULES.get(name, (MAX_LINES, ""))[0]}
    assert over == {}


def test_the_longer_modules_are_few_and_still_long():
    """An allowed module that fell back under MAX_LINES leaves the list, so it stays the
    short list of exceptions it is."""
    lines = _lines()
    assert len(LONGER_MODULES) <= 3
    assert {name: lines.get(name, 0) for name in LONGER_MODULES if lines.get(name, 0) <= MAX_LINES} == {}


def test_the_checks_see_the_packages():
    """Guards the checks above against reading nothing."""
    graph = _graph()
    assert {
        "ovtrio.api",
        "ovtrio.scheduler",
        "ovtrio.loading",
        "ovtrio.model",
        "ovtrio.parsing",
        "ovtrio.output",
    } <= set(graph) | {t for targets in graph.values() for t in targets}
    assert "ovtrio.scheduler" in graph["ovtrio.api"]
    assert len(_lines()) > 100 and max(_lines().values()) > MAX_LINES / 2
