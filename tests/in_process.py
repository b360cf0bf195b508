"""ovtrio served by Hypercorn inside the test process, over the fake engine.

For tests of what the HTTP layer decides (keys, origins and hosts, body limits,
validation, residency's answers): everything but the engine is the server's own. The
app is built by create_app's phases (ovtrio/server/app.py) with a loader that hands
each model a fake pipeline (fake_engine.py) beside what a real load reads from the
model's files (its tokenizer, vocabulary and plain-text tokenizer), so prompts are
rendered and encoded, and replies decoded and constrained, as a real server does; the
app's lifespan starts the registry, and Hypercorn serves it on a free loopback port
from a trio nursery in a thread of its own, so a test reaches it with the same clients
as a server process. Starting one takes milliseconds of the test process's time where a
process takes seconds of CPU to import and load.

A module declares one with `in_process_server(name, *flags, files=...)`, as it would a
server process with server_pool.server_fixture: the flags are `ovtrio serve`'s, and
`{folder}` / `{name}` in a flag become the server's folder and the path of its file
`name`.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import tempfile
import threading
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


@dataclass
class InProcessServer:
    """A served app: where clients reach it, and what it serves (its registry, and the
    fake pipeline of each model it loaded, by model name, newest load last)."""

    base_url: str
    registry: Any
    pipelines: dict[str, list[FakePipeline]] = field(default_factory=dict)

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


def fake_loader(pipelines: dict[str, list[FakePipeline]], kv_capacity: int = 8192) -> Callable[..., list[Any]]:
    """A loader (ovtrio/serving/service.py's Loader) whose loads end at once, each with a
    new FakePipeline (kept in `pipelines` by model name) and what a real load reads
    beside the engine: the model's real tokenizer (with the --chat-template given), its
    vocabulary and plain-text tokenizer; its KV cache holds `kv_capacity` tokens. Each
    step writes the token of "a" (the fake's token 1 is a special token of a real
    vocabulary, which a reply does not show)."""
    import openvino_genai

    from ovtrio.loading.deadline import LoadProgress
    from ovtrio.loading.load import LoadedModel, _chat_template
    from ovtrio.loading.tables import LoadTables
    from ovtrio.loading.thread import ModelLoad

    def loaded(source: Any, settings: Any) -> tuple[Any, int]:
        folder = tokenizer_folder(source.path.resolve())
        with LoadTables(source.path, source.kind, settings.grammar_cache_bytes) as tables:
            tokenizer = openvino_genai.Tokenizer(str(folder))
            template = _chat_template(settings)
            if template is not None:
                tokenizer.set_chat_template(template)
            read = tables.finish(tokenizer, folder)
        pipeline = FakePipeline()
        pipeline.token = int(tokenizer.encode("a", add_special_tokens=False).input_ids.data[0][0])
        pipelines.setdefault(source.name, []).append(pipeline)
        model = LoadedModel(
            source, pipeline, tokenizer, "CPU", 0.0, vocabulary=read.vocabulary, plain_text=read.plain_text
        )
        return model, kv_capacity

    def load(models: Sequence[tuple[Any, Any]]) -> list[ModelLoad]:
        loads = []
        for source, settings in models:
            handle = ModelLoad(LoadProgress(source.name, settings.load_timeout))
            handle.finish(outcome.capture(loaded, source, settings))
            loads.append(handle)
        return loads

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

    from ovtrio.server import app as startup
    from ovtrio.server.body_limit import BodyLimit, takes_images_at_start
    from ovtrio.serving.metrics import ServerMetrics

    async def main() -> None:
        startup.install_process_seams(settings)
        served = startup.ServedModels.read(settings)
        metrics = ServerMetrics()
        vision = takes_images_at_start(served.generation, served.in_folder)
        limit = BodyLimit(settings, {}, vision=vision, audio=served.audio)
        loader = fake_loader(server.pipelines)
        registry = startup.build_registry(settings, served, metrics, None, limit, loader)
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
    server = InProcessServer(f"http://127.0.0.1:{port}", registry=None)
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
        while thread.is_alive():
            try:
                if loopback.get(server.base_url + "/health/ready", timeout=10).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            threading.Event().wait(0.02)
        if not thread.is_alive():
            raise RuntimeError(f"the in-process server stopped before it was ready: {serving[1:]}")
        yield server
    finally:
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
    with `files` written into its folder first, then `prepare(folder)` called."""
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
