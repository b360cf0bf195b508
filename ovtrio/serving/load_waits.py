"""Two waits of a model's load, outside the service that runs it (service.py): for the
load's thread, within its deadline, and for memory to settle once the model is ready."""

from __future__ import annotations

import gc
import logging
import time

import trio

from ovtrio.loading import LoadedModel, ModelLoad
from ovtrio.loading.deadline import dump_stacks
from ovtrio.model import ModelLoadError
from ovtrio.serving import memory

__all__ = ["loaded_within_deadline", "settle_memory"]

log = logging.getLogger("ovtrio")


async def loaded_within_deadline(load: ModelLoad) -> tuple[LoadedModel, int]:
    """The load's result once it ends; ModelLoadError naming the phase it hung in (and
    every thread's stack in the log) once it is past its deadline (ovtrio/loading/deadline.py).
    Cancelled (the server stops), it leaves the load's thread to itself: a load that
    hangs never holds a shutdown."""
    progress = load.progress
    while True:
        deadline = progress.deadline()
        wait_for = None if deadline is None else max(0.0, deadline - time.monotonic())
        if await trio.to_thread.run_sync(load.wait, wait_for, abandon_on_cancel=True):
            return load.take()
        deadline = progress.deadline()  # a load that began late has its deadline moved
        if deadline is not None and time.monotonic() >= deadline:
            load.abandon()
            progress.end()
            log.error("the load of %s is past its deadline; the stack of each thread follows", progress.name)
            dump_stacks()
            raise ModelLoadError(progress.overdue_reason())


async def settle_memory() -> None:
    """What a model's ready is followed by, once the requests that waited for it have
    been let go. Loading and warming up freed much that glibc would otherwise keep: it is
    returned (in a worker thread). What exists then (modules, the loaded models' objects)
    lives on: frozen, out of the collector's sight, a full collection no longer walks it
    and pauses the event loop for that long (a model unloaded later is freed by reference
    counts: ModelService.run). The garbage made since the last freeze (requests' and
    connections' reference cycles) is collected first: frozen, it would stay for good.
    That collection walks only what came since the last freeze. Not at the first freeze:
    it would walk the whole heap (a pause just as the first requests come), for the
    little garbage the start leaves, once."""
    await memory.return_free_memory()
    if gc.get_freeze_count():
        gc.collect()
    gc.freeze()
