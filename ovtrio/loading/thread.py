"""A model's load in a thread of its own, started before the web framework is imported:
the engine compiles in C++ without the GIL, so the two overlap (load.py does the load)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import outcome

from ovtrio.engine.binding import prepare_binding
from ovtrio.loading.deadline import LoadProgress
from ovtrio.loading.load import LoadedModel, load_and_warm_up
from ovtrio.model.source import ModelSource
from ovtrio.settings.server import Settings


def import_engine() -> None:
    """Import the engine's library in the calling thread, and make its binding safe to
    use from several threads (ovtrio/engine/binding.py); cheap after the first call. Its
    import holds the GIL: done by `ovtrio serve` before the load thread starts, it does
    not take turns with the web framework's import that follows, and the engine begins
    compiling (without the GIL) that much sooner (why: docs/benchmarks.md#loading-a-model).
    Raises ImportError when OpenVINO GenAI is not installed."""
    prepare_binding()


class ModelLoad:
    """A model's load in the load thread, and its result (the loaded model and its KV
    cache's capacity), handed over once. Whoever keeps the handle after that (the
    launcher's frames keep them for as long as the server runs) keeps nothing: once the
    model is unloaded, nothing holds its pipeline. `progress` says which phase the
    load is in (deadline.py)."""

    def __init__(self, progress: LoadProgress) -> None:
        self.progress = progress
        self._done = threading.Event()
        self._outcome: outcome.Outcome[tuple[LoadedModel, int]] | None = None
        self._abandoned = False

    def finish(self, result: outcome.Outcome[tuple[LoadedModel, int]]) -> None:
        if not self._abandoned:
            self._outcome = result
        self._done.set()

    def abandon(self) -> None:
        """Nobody will take the result (the load overstayed its deadline): a load that
        still ends later drops its model at once."""
        self._abandoned = True
        self._outcome = None

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to `timeout` seconds for the load to end; whether it has."""
        return self._done.wait(timeout)

    def take(self) -> tuple[LoadedModel, int]:
        """Wait for the load to end; its result, or the error it raised. Once only."""
        self._done.wait()
        result, self._outcome = self._outcome, None
        if result is None:
            raise RuntimeError("a model's load was already taken")
        return result.unwrap()


def start_loading(source: ModelSource, settings: Settings) -> ModelLoad:
    """load_and_warm_up in a thread of its own, started now; its result, later.

    `ovtrio serve` starts the load before importing the web framework and building
    the app: the engine compiles in C++ without the GIL, so the two overlap (on 2
    cores, about a second less from start to ready). A daemon thread: a server that
    stops while the model still loads does not wait for the load to finish.
    """
    return start_loading_in_order([(source, settings)])[0]


def start_loading_in_order(models: Sequence[tuple[ModelSource, Settings]]) -> list[ModelLoad]:
    """start_loading for several models, loaded one after the other in one thread: each
    load keeps a core busy compiling, and a GGUF file converted for the first model is in
    the model cache for a later one. A model that fails to load does not stop the next
    one: its handle holds the error. Each load's deadline is its model's
    load_timeout, counted from when it begins."""
    import_engine()  # before the thread: its binding's tables are built on this one
    loads = [ModelLoad(LoadProgress(source.name, settings.load_timeout)) for source, settings in models]

    def load() -> None:
        for (source, settings), handle in zip(models, loads):
            handle.finish(outcome.capture(load_and_warm_up, source, settings, handle.progress))

    threading.Thread(target=load, name="ovtrio-model-load", daemon=True).start()
    return loads
