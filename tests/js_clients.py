"""The JavaScript clients the tests run against the server (tests/js: npm packages
pinned by package.json and its lockfile, and one script per client), installed by npm
into a cache folder once per version of the pins."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

JS = Path(__file__).parent / "js"


@pytest.fixture(scope="session")
def js_clients() -> Path:
    """The folder holding the pinned packages' node_modules and the scripts."""
    npm = shutil.which("npm")
    assert npm is not None, "npm is needed (apt-get install npm)"
    pinned = (JS / "package.json").read_bytes() + (JS / "package-lock.json").read_bytes()
    folder = Path.home() / ".cache" / "ovtrio-tests" / ("js-" + hashlib.sha256(pinned).hexdigest()[:16])
    if not (folder / "node_modules" / ".package-lock.json").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copy(JS / name, folder / name)
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=folder, check=True, capture_output=True, timeout=600)
    for script in JS.glob("*.mjs"):
        shutil.copy(script, folder / script.name)
    return folder
