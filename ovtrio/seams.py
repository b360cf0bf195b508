"""The places where ovtrio reaches into another library's internals, and whether each took.

Each seam replaces or extends code that the library does not offer as an interface: the
Hypercorn patches (hypercorn_patches/), the request body that fills Quart-Trio's body
buffer in place (api/request_body.py) and the byte bound on the engine's compiled-grammar
cache (constraints/cache.py). Each checks that the code it relies on is the code it was
written for, and leaves the library alone otherwise, so a different version still serves,
without what the seam adds. pyproject.toml pins those libraries to the versions the seams
were written for; this record makes a seam that did not take visible anyway: the server
logs one line listing every seam at start (`startup_line`), and the tests assert that each
took (tests/test_seams.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import metadata

log = logging.getLogger("ovtrio")


@dataclass(frozen=True, slots=True)
class Seam:
    name: str
    library: str  # the distribution whose internals it touches
    applied: bool
    without_it: str  # what the server lacks when it did not take


_seams: dict[str, Seam] = {}
_announced = False  # the startup line has been written: later seams get a line each


def record(name: str, library: str, applied: bool, without_it: str) -> bool:
    """Note whether the seam `name` into `library` took; returns `applied`. One applied
    after the startup line (the engine's, applied as a model loads) is logged at once."""
    seam = _seams[name] = Seam(name, library, applied, without_it)
    if _announced:
        log.info("seam into another library: %s", _describe(seam))
    return applied


def recorded() -> list[Seam]:
    """The seams recorded so far in this process, in the order they were first applied."""
    return list(_seams.values())


def startup_line() -> str:
    """One line for the startup log: each seam recorded so far with its library's
    version, and what is missing where one did not take."""
    global _announced
    _announced = True
    return "seams into other libraries: " + "; ".join(_describe(seam) for seam in _seams.values())


def _describe(seam: Seam) -> str:
    state = "applied" if seam.applied else f"NOT applied: {seam.without_it}"
    return f"{seam.name} [{seam.library} {_version(seam.library)}] {state}"


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "?"
