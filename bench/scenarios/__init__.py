"""The benchmarks, one module each: a docstring saying what it measures and how (its
first line is the one-line help), `add_arguments(parser)` and `run(args) -> Outcome`.
bench/__main__.py runs one and writes its result."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
NAMES = tuple(sorted(path.stem for path in HERE.glob("*.py") if path.stem != "__init__"))


def docstring(name: str) -> str:
    """A scenario's docstring, read without importing it (some import OpenVINO)."""
    return ast.get_docstring(ast.parse((HERE / f"{name}.py").read_text(encoding="utf-8"))) or name


def load(name: str) -> ModuleType:
    return importlib.import_module(f"bench.scenarios.{name}")
