"""Real ovtrio servers on free loopback ports, serving the embedded model.

One server process (`server`) is started for the whole session with `python -m ovtrio
serve` (the same entry point users run) and shared by most tests; servers with other
settings are declared with server_pool.server_fixture, and all of them start together
as soon as the tests are collected (server_pool.py).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import loopback
from server_pool import ServerPool, registered, server_fixture

MODEL = "SmolLM2-135M-Instruct"

# Every server of the session, and the in-process pipeline, share one model cache
# (ovtrio/gguf/cache.py), so only the first start converts the GGUF file; the
# environment carries it to every server, whichever way a test starts it. Not the
# user's own cache: a session starts from none and leaves none behind.
SESSION_CACHE = Path(tempfile.mkdtemp(prefix="ovtrio-test-cache-"))
os.environ["OVTRIO_CACHE_DIR"] = str(SESSION_CACHE)


def embedded_entry() -> Path:
    """The session cache's entry of the embedded model (other tests add entries of
    their own files beside it)."""
    from ovtrio.gguf.cache import engine_versions, entry_key, model_identity
    from ovtrio.model import embedded_model_path

    return SESSION_CACHE / "gguf" / entry_key(model_identity(embedded_model_path()), engine_versions())


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

    def metric(self, name: str, **labels: str) -> float:
        """Current value of one sample on /metrics (see sample_value)."""
        return sample_value(loopback.get(self.base_url + "/metrics", timeout=10).text, name, **labels)


def sample_value(exposition: str, name: str, **labels: str) -> float:
    """The value of the one sample named `name` (as exposed: `..._total`, `..._sum`,
    `..._bucket`) whose labels include `labels`, in a Prometheus text exposition."""
    found = [
        sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    ]
    if len(found) != 1:
        raise KeyError(f"{name}{labels}: {len(found)} samples")
    return found[0]


# Test servers run without the prefix cache. With it, a prompt whose first blocks come
# from the cache gets logits up to ~0.2 off those of a fresh prefill (measured on the
# bare engine, at f32 precision too), so the same greedy request can write other text
# the second time. Without it, repeating a request repeats its output exactly. (Nothing
# makes batching exact: on some CPUs a sequence's greedy text changes with the number of
# sequences stepped beside it, so tests compare outputs only between requests of the
# same shape: n choices against n choices, one request alone against one alone.)
EXACT_REPEATS = ("--no-enable-prefix-caching",)


# Seconds hypercorn-launched test servers keep an idle connection open (ovtrio's
# Hypercorn settings say 75): the keep-alive test waits that long.
HYPERCORN_KEEP_ALIVE = 2

# The hypercorn command as the README gives it (the test servers then override the bind
# address and the keep-alive timeout on the command line).
HYPERCORN_COMMAND = ("-m", "hypercorn", "-k", "trio", "--config", "python:ovtrio.server.hypercorn_config")


def launch_server(
    tmp_dir: Path, *args: str, env: dict[str, str] | None = None, hypercorn: bool = False
) -> RunningServer:
    """Start a server on a free port without waiting for it: `ovtrio serve` with the
    test servers' flags and `args`, or (`hypercorn`) `hypercorn -k trio --config
    python:ovtrio.server.hypercorn_config ovtrio.app:app`, configured by the environment alone.
    `env` is added to the environment."""
    port = free_port()
    if hypercorn:
        command = [
            sys.executable,
            *HYPERCORN_COMMAND,
            "-b",
            f"127.0.0.1:{port}",
            "--keep-alive",
            str(HYPERCORN_KEEP_ALIVE),
            "ovtrio.app:app",
        ]
    else:
        command = [
            sys.executable,
            "-m",
            "ovtrio",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *EXACT_REPEATS,
            *args,
        ]
    log_path = tmp_dir / f"server-{port}.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    return RunningServer(f"http://127.0.0.1:{port}", process, log_path)


# Servers load side by side (server_pool.py): on 2 cores a dozen take a minute or more,
# and far longer beside other work. Readiness is the server's own state (/health/ready,
# the process alive): this cap only keeps a start that hangs from hanging the session.
READY_WITHIN = 600


def wait_until_ready(server: RunningServer) -> RunningServer:
    """`server` once /health/ready says so; an error with its log if it exits, or if it
    is still not ready after READY_WITHIN seconds (a hang, not a slow machine)."""
    deadline = time.monotonic() + READY_WITHIN
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode}: {server.log_path.read_text()}")
        try:
            if loopback.get(server.base_url + "/health/ready", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    server.process.kill()
    raise RuntimeError(
        f"server still running but not ready after {READY_WITHIN} s (a cap for a start that hangs):"
        f" {server.log_path.read_text()}"
    )


def has_settled(server: RunningServer) -> bool:
    """Whether `server` has finished starting: it serves, or it has exited."""
    if server.process.poll() is not None:
        return True
    try:
        return loopback.get(server.base_url + "/health/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def start_server(tmp_dir: Path, *args: str, env: dict[str, str] | None = None) -> RunningServer:
    return wait_until_ready(launch_server(tmp_dir, *args, env=env))


@contextmanager
def running_server(tmp_dir: Path, *args: str) -> Iterator[RunningServer]:
    """A server with extra `ovtrio serve` flags, stopped when the block ends."""
    server = start_server(tmp_dir, *args)
    try:
        yield server
    finally:
        stop_server(server)


def stop_server(server: RunningServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.process.kill()


# The model name the hypercorn-launched server is configured to serve (by environment).
HYPERCORN_MODEL = "tiny-chat"


# The app as the hypercorn command serves it, configured by environment variables only,
# with the prefix cache on (the default, unlike the other test servers).
# Shared by the tests that need this entry point or the prefix cache. Its `process` is
# hypercorn's launcher, which serves from one worker child.
hypercorn_server = server_fixture(
    "hypercorn_server", env={"OVTRIO_SERVED_MODEL_NAME": HYPERCORN_MODEL, "OVTRIO_MAX_NUM_SEQS": "8"}, hypercorn=True
)


@dataclass
class LoadingServer:
    """A server whose model load waits for the test (see held_loading)."""

    base_url: str
    process: subprocess.Popen
    template_pipe: Path

    def release(self, template: str) -> None:
        """Let loading go on: hand the loader its chat template."""
        with open(self.template_pipe, "w") as pipe:  # blocks until the loader opens the pipe
            pipe.write(template)


@contextmanager
def held_loading(tmp_dir: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[LoadingServer]:
    """`ovtrio serve` listening, its model load held at a known point until release().

    The chat template is read while the model loads, and here it is a pipe that stays
    empty until the test writes it: the loading state is observed, not raced, and a test
    that needs only what answers before the model (probes, keys) never pays for a load.
    """
    template_pipe = tmp_dir / "template.jinja"
    os.mkfifo(template_pipe)
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "ovtrio", "serve", "--port", str(port), "--chat-template", str(template_pipe), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_WITHIN
        while True:
            assert process.poll() is None, f"the server exited with {process.returncode} before it listened"
            assert time.monotonic() < deadline, f"the server did not listen within {READY_WITHIN} s (a cap for a hang)"
            try:
                loopback.get(base_url + "/health", timeout=5)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        yield LoadingServer(base_url, process, template_pipe)
    finally:
        # A loader still blocked on the pipe would hold a graceful stop: kill.
        process.kill()
        process.wait(timeout=20)


# The server most tests share: the embedded model, the test servers' flags only.
server = server_fixture("server")

# A server run the other way on two independent settings: the binding's engine step
# (which holds the GIL) instead of the GIL-free one, and deltas merged over
# ALTERNATE_STREAM_INTERVAL engine steps. One server serves the tests of both.
ALTERNATE_STREAM_INTERVAL = 4
alternate_server = server_fixture(
    "alternate_server", "--no-gil-free-step", "--stream-interval", str(ALTERNATE_STREAM_INTERVAL)
)


def _load_embedded_pipeline(first_server: str | None) -> Any:
    from ovtrio.loading import load_model
    from ovtrio.model import resolve_model
    from ovtrio.settings.server import Settings

    if first_server is not None:  # the first server converts the model: load what it keeps
        deadline = time.monotonic() + READY_WITHIN
        # A first server of another model converts none: once it has started, convert here.
        while not _model_cached() and not _pool().has_settled(first_server) and time.monotonic() < deadline:
            if _SESSION_OVER.wait(0.1):
                return None  # no test is left to use it (collect-only, a stop at the first failure)

    settings = Settings(
        enable_prefix_caching=False, cache_size=1, max_num_batched_tokens=2048, cache_dir=str(SESSION_CACHE)
    )
    return load_model(resolve_model(settings), settings).pipeline


_POOL: ServerPool | None = None
_SESSION_OVER = threading.Event()
_PIPELINE: Future | None = None
_LOADER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedded-pipeline")


def _pool() -> ServerPool:
    global _POOL
    if _POOL is None:
        _POOL = ServerPool(
            lambda folder, spec: launch_server(folder, *spec.args, env=dict(spec.env), hypercorn=spec.hypercorn),
            wait_until_ready,
            has_settled,
            stop_server,
        )
    return _POOL


def _pipeline(first_server: str | None = None) -> Future:
    global _PIPELINE
    if _PIPELINE is None:
        _PIPELINE = _LOADER.submit(_load_embedded_pipeline, first_server)
    return _PIPELINE


# Fixtures that mean a test needs a model loaded, or may start a server of its own:
# `server_pool` (a test that takes a server for itself, to stop it), and two module
# fixtures of a real model's files (test_read_only_model.py's copy it serves,
# test_binding_threads.py's tokenizer the engine converts).
_NEEDS_A_MODEL = {"embedded_pipeline", "tmp_path", "tmp_path_factory", "server_pool", "place", "tokenizer_ir"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order the tests by when what they need is ready: those that need no model first,
    then those of the shared server (ready first) and of in-process servers, then the
    rest, whose servers load meanwhile (in module order otherwise: the sort is stable)."""
    import in_process  # its servers' fixtures, declared by the modules collected

    others = (_NEEDS_A_MODEL | set(registered())) - {"server", "embedded_pipeline"}
    for item in items:
        if _is_slow(item):
            item.add_marker(pytest.mark.slow)

    def readiness(item: pytest.Item) -> int:
        needs = set(_needs(item))
        if needs & others:
            return 2
        return 1 if needs & {"server", "embedded_pipeline", *in_process.declared()} else 0

    items.sort(key=readiness)


def _is_slow(item: pytest.Item) -> bool:
    """A test that needs a model loaded or converted: a server (in process too: it
    converts the embedded model's tokenizer), the in-process pipeline, a folder it may
    start a server or build a model in, a browser or a container. The others (pure logic,
    the HTTP layer over a test client) make the fast set, `python -m pytest -m "not slow"`."""
    import in_process

    if item.get_closest_marker("browser") or item.get_closest_marker("container"):
        return True
    return bool(set(_needs(item)) & (_NEEDS_A_MODEL | set(registered()) | set(in_process.declared())))


# Each server's last test: after it, the server is stopped (ServerPool.retire).
_LAST_USER: dict[str, str] = {}


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start every server the collected tests use, and the in-process pipeline, while
    the tests run (server_pool.py says why): the shared server first, the rest in the
    order of use."""
    used: dict[str, None] = {}
    for item in session.items:
        needs = _needs(item)
        used.update(dict.fromkeys(needs))
        _LAST_USER.update((name, item.nodeid) for name in needs if name in registered())
    wanted = [name for name in ("server", *used) if name in used and name in registered()]
    # The first server converts the model into the session's cache; the others start
    # once it is there and load it (about 3 s of CPU each instead of 6).
    if wanted:
        _pool().start_in_background(wanted[0], _model_cached, wanted[1:])
    if "embedded_pipeline" in used:
        _pipeline(first_server=wanted[0] if wanted else None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield  # the test's fixtures are torn down, those of its module too when it is the last
    done = [name for name, last in _LAST_USER.items() if last == item.nodeid]
    if done and _POOL is not None:
        _POOL.retire(done)


def _needs(item: pytest.Item) -> list[str]:
    """The fixtures a test uses, and the servers it is parametrized over (a test run
    against each of several servers gets their names as a parameter and asks the pool)."""
    names = list(getattr(item, "fixturenames", ()))
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        names += [value for value in callspec.params.values() if isinstance(value, str) and value in registered()]
    return names


def _model_cached() -> bool:
    entries = SESSION_CACHE / "gguf"
    return entries.is_dir() and any(not entry.name.startswith(".") for entry in entries.iterdir())


def pytest_sessionfinish(session: pytest.Session) -> None:
    _SESSION_OVER.set()
    if _POOL is not None:
        _POOL.close()
    shutil.rmtree(SESSION_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def server_pool() -> ServerPool:
    return _pool()


@pytest.fixture(scope="session")
def embedded_pipeline() -> Any:
    """The embedded model in an in-process ContinuousBatchingPipeline, for tests of what
    sits right on the engine (the GIL-free step, detokenizers); loaded in a thread while
    the first tests run. Without prefix caching a prompt computes the same logits every
    time it is run, so two runs of one greedy request are comparable token for token; a
    2048-token step lets a long prompt be prefilled in one step."""
    return _pipeline().result()


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
