"""A GGUF file the server cannot write is served all the same.

OpenVINO GenAI's GGUF reader opens its file read-write, so a user who cannot write the
file (a package installed by root and served by another user, a model on a read-only
volume) could not load it. The server converts a private copy in its model cache, once,
or in a temporary folder when it keeps no cache.

The servers here run as a user who is not root (root may write any file): as uid 1000
when the tests run as root, else as the tests' own user. Their model is a copy of the
embedded one, read-only, in a read-only folder.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from conftest import RunningServer, free_port, wait_until_ready
from ovtrio.model import embedded_model_path

ROOT = Path(__file__).resolve().parents[1]
UID = 1000  # the user the servers run as when the tests run as root


def as_user() -> list[str]:
    """The command prefix that runs a program as the servers' user (none when the tests
    do not run as root)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to run the server as another user"
    prefix = [setpriv, f"--reuid={UID}", f"--regid={UID}", "--clear-groups"]
    probe = subprocess.run(
        [*prefix, sys.executable, "-c", "import ovtrio, openvino_genai"], cwd=ROOT, capture_output=True
    )
    if probe.returncode != 0:
        # The interpreter or its site-packages lie where that user cannot reach them (a
        # pyenv under /root, mode 0700): it may then read and search any file, which
        # still lets it write none of root's, the model file among them.
        prefix += ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
    return prefix


def fingerprint(path: Path) -> tuple[int, int, int, str]:
    stat = path.stat()
    return stat.st_mode & 0o777, stat.st_size, stat.st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def place() -> Iterator[Path]:
    """A folder the servers' user can read: model/ (read-only, holding a read-only copy
    of the embedded model), and cache/ and home/ that user owns."""
    folder = Path(tempfile.mkdtemp(prefix="ovtrio-read-only-model-"))
    folder.chmod(0o755)
    model = folder / "model"
    model.mkdir()
    gguf = model / embedded_model_path().name
    shutil.copyfile(embedded_model_path(), gguf)
    gguf.chmod(0o444)
    model.chmod(0o555)
    for name in ("cache", "home"):
        (folder / name).mkdir()
        if os.geteuid() == 0:
            os.chown(folder / name, UID, UID)
    try:
        yield folder
    finally:
        model.chmod(0o755)
        shutil.rmtree(folder, ignore_errors=True)


def start(place: Path, *flags: str, env: dict[str, str] | None = None) -> RunningServer:
    port = free_port()
    log_path = place / f"server-{port}.log"
    command = [
        *as_user(),
        sys.executable,
        "-m",
        "ovtrio",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        str(place / "model" / embedded_model_path().name),
        *flags,
    ]
    env = {**os.environ, "HOME": str(place / "home"), "PYTHONPATH": str(ROOT), **(env or {})}
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = wait_until_ready(RunningServer(f"http://127.0.0.1:{port}", process, log_path))
    assert os.stat(f"/proc/{process.pid}").st_uid == (UID if os.geteuid() == 0 else os.geteuid())  # not root
    return server


def stop(server: RunningServer) -> str:
    """Stop with SIGTERM; the server's log, once it has exited 0."""
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=60) == 0, server.log_path.read_text()
    return server.log_path.read_text()


def chat(server: RunningServer) -> None:
    client = openai.OpenAI(base_url=server.v1, api_key="none", timeout=60)
    reply = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        extra_body={"ignore_eos": True},  # where the model stops depends on the CPU: the length is forced
    )
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 4


def test_a_read_only_gguf_file_is_converted_once_from_a_private_copy(place):
    gguf = place / "model" / embedded_model_path().name
    before = fingerprint(gguf)
    cache = place / "cache"

    first = start(place, "--cache-dir", str(cache))
    chat(first)
    log = stop(first)
    # The copy is made in the child that builds the entry, whose records the server logs.
    assert "converting a private copy" in log and "converted and cached in" in log, log
    assert len(list((cache / "gguf").iterdir())) == 1
    assert not [path for path in cache.rglob("*") if path.suffix == ".gguf"]  # the copy is gone

    second = start(place, "--cache-dir", str(cache))
    chat(second)
    log = stop(second)
    assert "private copy" not in log and f"(cached in {cache}" in log, log

    assert fingerprint(gguf) == before


def test_without_a_model_cache_the_copy_is_temporary(place):
    scratch = place / "home" / "tmp"
    scratch.mkdir(exist_ok=True)
    if os.geteuid() == 0:
        os.chown(scratch, UID, UID)
    server = start(
        place, "--no-model-cache", "--cache-dir", str(place / "cache" / "unused"), env={"TMPDIR": str(scratch)}
    )
    chat(server)
    log = stop(server)
    assert f"converting a private copy in {scratch}" in log and "(converted)" in log, log
    assert not list(scratch.iterdir()) and not (place / "cache" / "unused").exists()
