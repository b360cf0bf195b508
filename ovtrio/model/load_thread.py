"""A model's load in a thread of its own, started before the web framework is imported:
the engine compiles in C++ without the GIL, so the two overlap (loading.py does the load)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future

from ovtrio.model.loading import LoadedModel, load_and_warm_up
from ovtrio.model.source import ModelSource
from ovtrio.settings.server import Settings


def import_engine() -> None:
    """Import the engine's library in the calling thread. Its import holds the GIL (0.1-0.2
    s): done by `ovtrio serve` before the load thread starts, it does not take turns
    with the web framework's import that follows, and the engine begins compiling
    (without the GIL) that much sooner."""
    import openvino_genai  # noqa: F401


def start_loading(source: ModelSource, settings: Settings) -> Future[tuple[LoadedModel, int]]:
    """load_and_warm_up in a thread of its own, started now; its result, later.

    `ovtrio serve` starts the load before importing the web framework and building
    the app: the engine compiles in C++ without the GIL, so the two overlap (on 2
    cores, about a second less from start to ready). A daemon thread: a server that
    stops while the model still loads does not wait for the load to finish.
    """
    return start_loading_in_order([(source, settings)])[0]


def start_loading_in_order(models: Sequence[tuple[ModelSource, Settings]]) -> list[Future[tuple[LoadedModel, int]]]:
    """start_loading for several models, loaded one after the other in one thread: each
    load keeps a core busy compiling, and a GGUF file converted for the first model is in
    the model cache for a later one. A model that fails to load does not stop the next
    one: its future holds the error."""
    futures: list[Future[tuple[LoadedModel, int]]] = [Future() for _ in models]

    def load() -> None:
        for (source, settings), future in zip(models, futures):
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(load_and_warm_up(source, settings))
            except BaseException as exc:  # noqa: BLE001 (handed to whoever waits for the model)
                future.set_exception(exc)

    threading.Thread(target=load, name="ovtrio-model-load", daemon=True).start()
    return futures
