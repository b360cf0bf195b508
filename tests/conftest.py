"""A real ovtrio server on a free loopback port, serving the embedded model.

One server process is started for the whole session with `python -m ovtrio serve`
(the same entry point users run) and shared by every test.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

MODEL = "SmolLM2-135M-Instruct"
SPEC_PATH = Path(__file__).resolve().parents[1].parent / "shared" / "openai-openapi.json"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class RunningServer:
    base_url: str
    process: subprocess.Popen
    log_path: Path

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"

    def metric(self, name: str) -> float:
        """Current value of a Prometheus gauge/counter from /metrics."""
        text = httpx.get(self.base_url + "/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise KeyError(name)


# Test servers run without the prefix cache. With it, a prompt whose first blocks come
# from the cache gets logits up to ~0.2 off those of a fresh prefill (measured on the
# bare engine, at f32 precision too), so the same greedy request can write other text
# the second time. Without it, repeating a request repeats its output exactly. (Nothing
# makes batching exact: on some CPUs a sequence's greedy text changes with the number of
# sequences stepped beside it, so tests compare outputs only between requests of the
# same shape: n choices against n choices, one request alone against one alone.)
EXACT_REPEATS = ("--no-enable-prefix-caching",)


def start_server(tmp_dir: Path, *args: str, env: dict[str, str] | None = None) -> RunningServer:
    port = free_port()
    log_path = tmp_dir / f"server-{port}.log"
    log = open(log_path, "w")
    process = subprocess.Popen(
        [
            sys.executable, "-m", "ovtrio", "serve", "--host", "127.0.0.1", "--port", str(port),
            *EXACT_REPEATS, *args,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}: {log_path.read_text()}")
        try:
            if httpx.get(base_url + "/health/ready", timeout=2).status_code == 200:
                return RunningServer(base_url, process, log_path)
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"server did not become ready: {log_path.read_text()}")


@contextmanager
def running_server(tmp_dir: Path, *args: str) -> Iterator[RunningServer]:
    """A server with extra `ovtrio serve` flags, stopped when the block ends."""
    server = start_server(tmp_dir, *args)
    try:
        yield server
    finally:
        stop_server(server)


def start_server_with_template(tmp_dir: Path, template: str, *args: str) -> RunningServer:
    """A server given `template` (Jinja text) as its --chat-template."""
    path = tmp_dir / "chat_template.jinja"
    path.write_text(template)
    return start_server(tmp_dir, "--chat-template", str(path), *args)


def stop_server(server: RunningServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.process.kill()


@contextmanager
def hypercorn_app(
    tmp_dir: Path, env: dict[str, str], *args: str
) -> Iterator[tuple[str, subprocess.Popen]]:
    """`hypercorn -k trio ovtrio.app:app` on a free port, configured by the environment
    (`env` added to it) and hypercorn flags `args`, once it is ready; its base URL and
    process. Stopped after with SIGTERM, which it must survive cleanly: exit code 0 and
    the engine released."""
    port = free_port()
    log_path = tmp_dir / f"hypercorn-{port}.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "hypercorn", "-k", "trio", "-b", f"127.0.0.1:{port}", *args, "ovtrio.app:app"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            try:
                if httpx.get(base_url + "/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        yield base_url, process
    finally:
        process.terminate()
        process.wait(timeout=20)
    # Only when the block succeeded: a failure there is the one to report.
    assert process.returncode == 0 and "engine released" in log_path.read_text(), log_path.read_text()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(tmp_path_factory.mktemp("server"))
    yield running
    stop_server(running)


@pytest.fixture(scope="session")
def client(server: RunningServer):
    import openai

    with openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=120) as sdk:
        yield sdk


@pytest.fixture
async def async_client(server: RunningServer):
    import openai

    async with openai.AsyncOpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=120) as sdk:
        yield sdk


@pytest.fixture(scope="session")
def openapi_spec() -> dict:
    with open(SPEC_PATH, encoding="utf-8") as file:
        return json.load(file)
