"""ovtrio served by Hypercorn inside the test process, over the fake engine.

For tests of what the HTTP layer decides (keys, origins and hosts, body limits,
validation, residency's answers): everything but the engine is the server's own. The
app is built by create_app's phases (ovtrio/server/app.py) with a loader that hands
each model a fake pipeline (fake_engine.py) beside what a real load reads from the
model's files (its tokenizer, vocabulary and plain-text tokenizer), so prompts are
rendered and encoded, and replies decoded and constrained, as a real server does, and
an encoder loader that builds each embedding, rerank, Whisper and text-to-speech model
as a fake (fake_encoders.py) whose answers a test computes from what it sent; the app's
lifespan starts the registry, and Hypercorn serves it on a free loopback port
from a trio nursery in a thread of its own, so a test reaches it with the same clients
as a server process. Starting one takes milliseconds of the test process's time where a
process takes seconds of CPU to import and load.

A module declares one with `in_process_server(name, *flags, files=..., prepare=...)`, as
it would a server process with server_pool.server_fixture: the flags are `ovtrio
serve`'s, `{folder}` / `{name}` in a flag become the server's folder and the path of its
file `name`, and `prepare(folder)` fills the folder first (a models folder).

A test steers what the engine would decide by its own pace: `server.loads` (FakeLoads)
holds the loads begun until it releases them, fails the next ones, and counts each
model's loads, encoders' too; `server.steps` (FakeSteps) holds the steps of a model's
pipelines while they run requests, and an encoder's batches, so a request stays running
(its lease held) while the test looks at the server.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import outcome
import pytest
import trio

import loopback
from conftest import EXACT_REPEATS, free_port, sample_value
from fake_engine import FakePipeline

_NAMES: list[str] = []  # the fixtures declared, which conftest puts in the slow set

# Seconds a held load or step waits for its release at most: a test that fails while
# holding one still ends (a bound on a hang, never a deadline of the server's).
HOLD_CAP = 300
READY_WITHIN = 300  # seconds an in-process server may take to be ready: a hang's bound only


class FakeLoads:
    """The fake loader's loads as a test steers them: `hold()` keeps every load begun
    from then on loading until `release()`; `fail_next(reason)` makes the next load fail
    with ModelLoadError(reason), as a real load the engine refuses; `count(model)` is how
    many loads of `model` have begun."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gate: threading.Event | None = None
        self._failures: list[str] = []
        self._counts: Counter[str] = Counter()

    def hold(self) -> None:
        with self._lock:
            if self._gate is None:
                self._gate = threading.Event()

    def release(self) -> None:
        with self._lock:
            gate, self._gate = self._gate, None
        if gate is not None:
            gate.set()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """hold() for the block, released when it ends (a test that fails too)."""
        self.hold()
        try:
            yield
        finally:
            self.release()

    def fail_next(self, reason: str) -> None:
        with self._lock:
            self._failures.append(reason)

    def count(self, model: str) -> int:
        with self._lock:
            return self._counts[model]

    def begin(self, model: str) -> tuple[threading.Event | None, str | None]:
        """A load of `model` begins: the gate it waits at (None: none), and the reason it fails with."""
        with self._lock:
            self._counts[model] += 1
            return self._gate, self._failures.pop(0) if self._failures else None


class FakeSteps:
    """Holds the steps of a model's fake pipelines while they run requests (`hold(model)`
    until `release(model)`). A pipeline with no request running steps freely: the
    scheduler's idle steps are never held, nor a step after the last request left."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, threading.Event] = {}

    def hold(self, model: str) -> None:
        with self._lock:
            self._held.setdefault(model, threading.Event())

    def release(self, model: str | None = None) -> None:
        """Let `model`'s steps go on (every model's, with None)."""
        with self._lock:
            names = list(self._held) if model is None else [model]
            gates = [self._held.pop(name) for name in names if name in self._held]
        for gate in gates:
            gate.set()

    @contextlib.contextmanager
    def held(self, model: str) -> Iterator[None]:
        """hold(model) for the block, released when it ends (a test that fails too)."""
        self.hold(model)
        try:
            yield
        finally:
            self.release(model)

    def wait(self, model: str) -> None:
        with self._lock:
            gate = self._held.get(model)
        if gate is not None:
            gate.wait(HOLD_CAP)


class StepsHeldPipeline(FakePipeline):
    """A FakePipeline of `model` whose steps with requests running wait while `steps` holds them."""

    def __init__(self, model: str, steps: FakeSteps) -> None:
        super().__init__()
        self.model = model
        self.held_steps = steps

    def step(self) -> None:
        if self._running():
            self.held_steps.wait(self.model)
        super().step()


@dataclass
class InProcessServer:
    """A served app: where clients reach it, its folder, and what it serves (its
    registry, and the fake pipeline of each model it loaded, by model name, newest load
    last), with the loads and steps a test steers (FakeLoads, FakeSteps)."""

    base_url: str
    registry: Any
    folder: Path = Path()
    pipelines: dict[str, list[FakePipeline]] = field(default_factory=dict)
    loads: FakeLoads = field(default_factory=FakeLoads)
    steps: FakeSteps = field(default_factory=FakeSteps)

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"

    def metric(self, name: str, **labels: str) -> float:
        return sample_value(loopback.get(self.base_url + "/metrics", timeout=10).text, name, **labels)


@functools.cache
def tokenizer_folder(model: Path) -> Path:
    """The tokenizer and detokenizer IR of the model at `model`: an IR folder's own, or
    a GGUF file's, converted once a session into a folder of their own (what the
    engine converts at a load; a few seconds)."""
    import openvino_genai

    if model.is_dir():
        return model
    folder = Path(tempfile.mkdtemp(prefix="ovtrio-in-process-tokenizer-"))
    link = folder / model.name
    link.symlink_to(model)
    openvino_genai.Tokenizer(str(link), enable_save_ov_model=True)
    link.unlink()
    return folder


def fake_loader(
    pipelines: dict[str, list[FakePipeline]],
    kv_capacity: int = 8192,
    loads: FakeLoads | None = None,
    steps: FakeSteps | None = None,
) -> Callable[..., list[Any]]:
    """A loader (ovtrio/serving/service.py's Loader) whose loads run in a thread of their
    own, one after the other, each ending with a new FakePipeline (kept in `pipelines` by
    model name; its steps held by `steps`) and what a real load reads beside the engine:
    the model's real tokenizer (with the --chat-template given), its vocabulary and
    plain-text tokenizer; its KV cache holds `kv_capacity` tokens. `loads` holds, fails
    and counts them (FakeLoads). Each step writes the token of "a" (the fake's token 1 is
    a special token of a real vocabulary, which a reply does not show)."""
    import openvino_genai

    from ovtrio.loading.deadline import LoadProgress
    from ovtrio.loading.load import LoadedModel, _chat_template
    from ovtrio.loading.tables import LoadTables
    from ovtrio.loading.thread import ModelLoad
    from ovtrio.model import ModelLoadError

    def loaded(source: Any, settings: Any) -> tuple[Any, int]:
        folder = tokenizer_folder(source.path.resolve())
        with LoadTables(source.path, source.kind, settings.grammar_cache_bytes) as tables:
            tokenizer = openvino_genai.Tokenizer(str(folder))
            template = _chat_template(settings)
            if template is not None:
                tokenizer.set_chat_template(template)
            read = tables.finish(tokenizer, folder)
        pipeline = StepsHeldPipeline(source.name, steps) if steps is not None else FakePipeline()
        pipeline.token = int(tokenizer.encode("a", add_special_tokens=False).input_ids.data[0][0])
        pipelines.setdefault(source.name, []).append(pipeline)
        model = LoadedModel(
            source, pipeline, tokenizer, "CPU", 0.0, vocabulary=read.vocabulary, plain_text=read.plain_text
        )
        return model, kv_capacity

    def run(source: Any, settings: Any, gate: threading.Event | None, failure: str | None) -> tuple[Any, int]:
        if gate is not None:
            gate.wait(HOLD_CAP)
        if failure is not None:
            raise ModelLoadError(failure)
        return loaded(source, settings)

    def load(models: Sequence[tuple[Any, Any]]) -> list[ModelLoad]:
        begun = []
        for source, settings in models:
            gate, failure = loads.begin(source.name) if loads is not None else (None, None)
            begun.append((ModelLoad(LoadProgress(source.name, settings.load_timeout)), source, settings, gate, failure))

        def load_in_order() -> None:
            for handle, source, settings, gate, failure in begun:
                handle.finish(outcome.capture(run, source, settings, gate, failure))

        threading.Thread(target=load_in_order, name="fake-model-load", daemon=True).start()
        return [handle for handle, *_ in begun]

    return load


def settings_of(flags: Sequence[str], host: str, port: int) -> Any:
    """The Settings `ovtrio serve` takes from `flags` (and the environment)."""
    from ovtrio.server.cli import build_parser
    from ovtrio.settings.server import Settings, settings_from_env

    args = build_parser().parse_args(["serve", "--host", host, "--port", str(port), *flags])
    overrides = {key: value for key, value in vars(args).items() if key in Settings.model_fields and value is not None}
    return settings_from_env(**overrides)


def _serve(settings: Any, server: InProcessServer, started: threading.Event, serving: list[Any]) -> None:
    from hypercorn.config import Config
    from hypercorn.trio import serve

    from fake_encoders import fake_encoder_loader
    from ovtrio.server import app as startup
    from ovtrio.server.body_limit import BodyLimit, takes_images_at_start
    from ovtrio.serving.metrics import ServerMetrics

    async def main() -> None:
        startup.install_process_seams(settings)
        served = startup.ServedModels.read(settings)
        metrics = ServerMetrics()
        vision = takes_images_at_start(served.generation, served.in_folder)
        limit = BodyLimit(settings, {}, vision=vision, audio=served.audio)
        loader = fake_loader(server.pipelines, loads=server.loads, steps=server.steps)
        encoder_loader = fake_encoder_loader(server.loads, server.steps)
        registry = startup.build_registry(settings, served, metrics, None, limit, loader, encoder_loader)
        app = startup.app_over(registry, settings, metrics, limit, startup.response_store_of(settings))
        server.registry = registry
        config = Config.from_object("ovtrio.server.hypercorn_config")
        config.bind = [f"{settings.host}:{settings.port}"]
        config.accesslog = None
        config.errorlog = None
        stop = trio.Event()
        serving.append((trio.lowlevel.current_trio_token(), stop))
        started.set()
        await serve(app, config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]

    try:
        trio.run(main)
    except Exception as exc:  # noqa: BLE001 (reported by the fixture, which waits for readiness)
        serving.append(exc)
        started.set()


def _serving(flags: Sequence[str], folder: Path) -> Iterator[InProcessServer]:
    port = free_port()
    settings = settings_of([*EXACT_REPEATS, *flags], "127.0.0.1", port)
    server = InProcessServer(f"http://127.0.0.1:{port}", registry=None, folder=folder)
    started = threading.Event()
    serving: list[Any] = []
    thread = threading.Thread(target=_serve, args=(settings, server, started, serving), daemon=True)
    thread.start()
    started.wait()
    failures = [item for item in serving if isinstance(item, BaseException)]
    if failures:
        raise failures[0]
    token, stop = serving[0]
    try:
        ready, ready_by = False, time.monotonic() + READY_WITHIN
        while not ready and thread.is_alive() and time.monotonic() < ready_by:
            try:
                ready = loopback.get(server.base_url + "/health/ready", timeout=10).status_code == 200
            except httpx.TransportError:
                pass
            if not ready:
                threading.Event().wait(0.02)
        if not ready:
            state = "stopped" if not thread.is_alive() else f"was not ready within {READY_WITHIN} s"
            raise RuntimeError(f"the in-process server {state}: {serving[1:]}")
        yield server
    finally:
        server.loads.release()
        server.steps.release()
        trio.from_thread.run_sync(stop.set, trio_token=token)
        thread.join()
        shutil.rmtree(folder, ignore_errors=True)


def in_process_server(
    name: str,
    *flags: str,
    files: Mapping[str, str] | None = None,
    prepare: Callable[[Path], None] | None = None,
) -> Callable[..., Any]:
    """The module fixture `name`: an in-process server of `ovtrio serve`'s `flags`,
    with `files` written into its folder first, and `prepare(folder)` run then."""
    _NAMES.append(name)

    @pytest.fixture(scope="module", name=name)
    def the_server() -> Iterator[InProcessServer]:
        folder = Path(tempfile.mkdtemp(prefix=f"ovtrio-{name}-"))
        paths = {"folder": str(folder)}
        for file_name, text in (files or {}).items():
            (folder / file_name).write_text(text)
            paths[file_name] = str(folder / file_name)
        if prepare is not None:
            prepare(folder)
        filled = [_fill(flag, paths) for flag in flags]
        yield from _serving(filled, folder)

    return the_server


@contextlib.contextmanager
def serving_in_process(*flags: str) -> Iterator[InProcessServer]:
    """An in-process server of `ovtrio serve`'s `flags` for the block, stopped (its
    lifespan ended) when the block ends: for a test that stops a server and starts
    another on what the first left on disk."""
    yield from _serving(flags, Path(tempfile.mkdtemp(prefix="ovtrio-in-process-")))


def _fill(flag: str, paths: Mapping[str, str]) -> str:
    for key, path in paths.items():
        flag = flag.replace("{" + key + "}", path)
    return flag


def declared() -> list[str]:
    return list(_NAMES)
