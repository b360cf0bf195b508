"""Every seam into another library's internals takes on the versions pyproject.toml pins,
and a server says so at start (ovtrio/seams.py): an upgrade that changes the code a seam
was written for fails here instead of quietly serving without it."""

from __future__ import annotations

import re
import time
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from ovtrio import seams
from ovtrio.api import request_body
from ovtrio.server.hypercorn_patches import connection_close, drain, websocket_message_size

# Each library a seam reaches into, pinned to one version.
SEAMED_LIBRARIES = ("hypercorn", "quart", "quart-trio", "openvino-genai")

# The seams each kind of server records: the HTTP ones at start, the engine's as its
# model loads; the drain patch only under the hypercorn command.
SERVE_SEAMS = {"connection close", "uncopied request bodies", "WebSocket message bound", "compiled-grammar cache bound"}
HYPERCORN_SEAMS = SERVE_SEAMS | {"drain under the hypercorn command"}


def _pins() -> dict[str, str]:
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(text) for text in project["dependencies"]]
    return {req.name.lower(): str(req.specifier) for req in requirements}


@pytest.mark.parametrize("library", SEAMED_LIBRARIES)
def test_each_library_a_seam_reaches_into_is_pinned_to_the_installed_version(library):
    pin = _pins()[library]
    if library == "openvino-genai":
        # The grammar-cache bound reads the library's relocations, which a release keeps
        # or not: a range within one release line, and the seam's own test below.
        assert pin.startswith(">=") or "<" in pin, pin
        return
    assert pin == f"=={metadata.version(library)}", f"{library} is not pinned: {pin}"


def test_the_hypercorn_patches_and_the_body_buffer_take_on_the_pinned_versions():
    assert connection_close.apply()
    assert websocket_message_size.apply(1 << 20)
    assert request_body.fits_quart_trio()

    async def no_drain(cause: str) -> None:
        pass

    assert drain.apply(no_drain)


def test_the_startup_line_names_each_seam_with_its_library_and_what_a_failed_one_loses(monkeypatch):
    monkeypatch.setattr(seams, "_seams", {})
    monkeypatch.setattr(seams, "_announced", False)
    seams.record("one", "hypercorn", True, "nothing")
    seams.record("two", "quart-trio", False, "bodies are copied")
    line = seams.startup_line()
    assert f"one [hypercorn {metadata.version('hypercorn')}] applied" in line
    assert f"two [quart-trio {metadata.version('quart-trio')}] NOT applied: bodies are copied" in line
    assert [seam.name for seam in seams.recorded()] == ["one", "two"]


def _seams_logged(log_text: str) -> dict[str, str]:
    """Each seam named in a server's log, with its state ("applied" or "NOT applied: ...")."""
    found = {}
    for line in log_text.splitlines():
        if "seams into other libraries: " in line:
            entries = line.split("seams into other libraries: ", 1)[1].split("; ")
        elif "seam into another library: " in line:
            entries = [line.split("seam into another library: ", 1)[1]]
        else:
            continue
        for entry in entries:
            match = re.match(r"(.+?) \[[^\]]+\] (.*)$", entry.strip())
            assert match, entry
            found[match.group(1)] = match.group(2)
    return found


def test_a_server_logs_every_seam_applied(server):
    """Under `ovtrio serve`; the hypercorn command's: test_launcher_parity.py."""
    assert_every_seam_logged_applied(server, SERVE_SEAMS)


def assert_every_seam_logged_applied(running, expected: set[str]) -> None:
    """`running`'s log names the seams `expected`, and no other, each applied."""
    deadline = time.monotonic() + 30
    while True:
        logged = _seams_logged(running.log_path.read_text(errors="replace"))
        if set(logged) >= expected or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert set(logged) == expected
    assert all(state == "applied" for state in logged.values()), logged
