"""The model service: loads one model off the event loop, then runs its scheduler, until
it is unloaded (ovtrio/serving/residency.py decides when) and maybe loaded again.

Routes open before the model is loaded (readiness answers 503 meanwhile), so loading
happens in a task of the app's nursery, or, under `ovtrio serve`, in a thread started
before the app was even imported, which that task waits for (load_thread.start_loading);
the path is checked up front, so a missing or unusable model stops startup at once with
one line. Once loaded, everything a request needs is in one ServingModel, whose fields
are never missing. A server serves one or several models, each through a service of its
own (ovtrio/serving/registry.py holds them).
"""

from __future__ import annotations

import gc
import logging
import time
import weakref
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import trio

from ovtrio.engine.backend import engine_backend
from ovtrio.engine.errors import client_reason
from ovtrio.lifecycle.lease import LeaseCount
from ovtrio.lifecycle.load_retry import FilesVersion, files_version
from ovtrio.lifecycle.resident import ModelState
from ovtrio.loading import ModelLoad, start_loading_in_order
from ovtrio.loading.speculation import apply_defaults
from ovtrio.model import ModelLoadError, ModelSource, resolve_model
from ovtrio.model.shown_paths import without_model_path
from ovtrio.scheduler import GenerationScheduler, RequestObserver, SchedulerStats, added_to
from ovtrio.scheduler.engine_step import choose_step
from ovtrio.serving import memory
from ovtrio.serving.load_waits import loaded_within_deadline, settle_memory
from ovtrio.serving.serving_model import ServingModel, load_summary, serving_model
from ovtrio.settings.server import Settings

__all__ = ["ModelService", "ObserverFactory", "ServingModel", "check_model"]

log = logging.getLogger("ovtrio")


# Makes the observer of a model's requests from its served name, its context length and
# whether the pipeline speculates.
ObserverFactory = Callable[[str, int, bool], RequestObserver]


def check_model(settings: Settings) -> tuple[ModelSource, FilesVersion]:
    """The model `settings` name, checked (resolve_model), and its files' version: what
    ModelService.check finds, for a worker thread (it reads the files)."""
    source = resolve_model(settings)
    return source, files_version(source.path)


Loader = Callable[[Sequence[tuple[ModelSource, Settings]]], list[ModelLoad]]
"""The one seam between a model's lifecycle and the engine: starts the loads of the
models given (each source with its settings), one after the other, and returns a handle
to each at once. The server's is start_loading_in_order, which builds the engine; tests
give one that hands back a fake or scripted pipeline."""


class ModelService:
    def __init__(
        self,
        settings: Settings,
        observer: ObserverFactory | None = None,
        loading: ModelLoad | None = None,
        on_demand: bool = False,
        loader: Loader = start_loading_in_order,
    ) -> None:
        """`observer`, when given, makes what the scheduler reports each request's
        timings and end to (the metrics), once the model is known. `loading`, when
        given, is the load already under way (start_loading) of the model that
        `settings` name; it may also be set later, before `run`. `on_demand`: the
        model waits for its first request to load. `loader` starts each load after
        the first (or the first, when `loading` is not given)."""
        self.settings = settings
        self._loader = loader
        self._observer = observer
        self.loading = loading
        # Loaded on the first request that names it (a models_dir's model), not at start.
        self.on_demand = loading is None and on_demand
        self._checked_files: FilesVersion = None  # the files as check() found them
        self.source: ModelSource | None = None
        self.serving: ServingModel | None = None  # set when ready
        # Each load is a cycle of its own, with fresh events: `ready` once it serves,
        # `failed` (with `failure`) if its load or its scheduler failed.
        self.cycles = 0
        self.ready = trio.Event()
        self.failed = trio.Event()
        self._failure: str | None = None
        self.refusal: str | None = None  # why the last load could not begin (refuse)
        # Seconds the last load took (loaded and warmed up), for the metrics and the list.
        self.load_seconds: float | None = None
        # The scheduler counters of the earlier loads, which /metrics carries on from.
        self.earlier_totals: SchedulerStats | None = None
        self._running = trio.CancelScope()
        self._stopped = trio.Event()
        self._started = False
        self._in_cycle = False  # a load has begun and its serving has not ended
        self._in_run = False  # run() serves this cycle: it alone sets _stopped
        self._unloading = False
        # Whether the last engine outlived its last reference: the unload then collects (run).
        self._collect = False
        # Told when an engine is released other than by an unload (its scheduler failed,
        # or the server stops), so that loads minus unloads stays the number loaded;
        # set by the residency, which counts the loads and its own unloads.
        self.released: Callable[[str, str], None] | None = None
        # When a request last named the model (trio's clock), and how long it may stay
        # loaded idle after that when a request said so (its keep_alive; None: the
        # server's model_idle_unload).
        self.last_used = 0.0
        self.keep_alive: float | None = None
        # The requests that hold the model now (ovtrio/lifecycle/lease.py): a model with one out is in use.
        self.leases = LeaseCount()
        self.started_at = time.time()
        # Where clients reach the server, when the launcher knows it (`ovtrio serve`
        # does; under a bare `hypercorn` the address is in hypercorn's own log line).
        self.base_url: str | None = None

    @property
    def failure(self) -> str | None:
        """Why the last load or serving failed, as clients read it: the model named by its
        file or folder, not its path (shown_paths.py; the log has the path)."""
        return self._failure

    @failure.setter
    def failure(self, reason: str | None) -> None:
        self._failure = None if reason is None else without_model_path(reason, self._model_path())

    def _model_path(self) -> Path | None:
        if self.source is not None:
            return self.source.path
        return Path(self.settings.model) if self.settings.model else None

    @property
    def model_name(self) -> str:
        if self.source is None:  # a models_dir's model whose file is unusable: named after it
            assert self.settings.served_model_name is not None, "check() runs before serving"
            return self.settings.served_model_name
        return self.source.name

    def check(self) -> ModelSource:
        """Resolve and check the model path; raises ModelLoadError (one line) if unusable.
        It reads the model's files: on the event loop only before the server serves."""
        self.take_check(*check_model(self.settings))
        assert self.source is not None
        return self.source

    async def check_in_thread(self) -> ModelSource:
        """check, with the files read in a worker thread."""
        self.take_check(*await trio.to_thread.run_sync(check_model, self.settings))
        assert self.source is not None
        return self.source

    def take_check(self, source: ModelSource, files: FilesVersion) -> None:
        """What check_model found of this model's files, in a worker thread."""
        self.source = source
        self._checked_files = files

    def files_changed(self) -> bool:
        """Whether the model's files changed since they were checked (a file replaced
        under the same name: its context length and vocabulary are read again)."""
        return self.source is not None and files_version(self.source.path) != self._checked_files

    @property
    def name(self) -> str:
        """The name requests give it (Resident.name)."""
        return self.model_name

    @property
    def kind(self) -> str:
        return "generation"

    @property
    def state(self) -> ModelState:
        if self._unloading:
            return ModelState.UNLOADING
        if self.failed.is_set():
            return ModelState.FAILED
        if self.ready.is_set():
            return ModelState.LOADED
        if self._in_cycle or (self.cycles == 0 and not self.on_demand):
            return ModelState.LOADING
        return ModelState.UNLOADED

    @property
    def idle(self) -> bool:
        """Loaded, with no lease out and no request running (Resident.idle)."""
        return self.state == ModelState.LOADED and not self.in_flight and not self.leases.held

    @property
    def in_flight(self) -> int:
        """Requests the loaded model runs or queues (0 when it is not loaded)."""
        serving = self.serving
        return serving.scheduler.in_flight if serving is not None else 0

    def begin_cycle(self) -> None:
        """A new load begins (run follows): fresh events, the model now "loading". An
        event not yet set is kept (requests may wait on it already: a model loaded at
        start); one set, by an earlier load or by a file found unusable when the folder
        was read, is spent."""
        if self.ready.is_set() or self.failed.is_set():
            self.ready = trio.Event()
            self.failed = trio.Event()
            self.failure = None
        self.refusal = None
        self.cycles += 1
        self._in_cycle = True
        self._running = trio.CancelScope()
        self._stopped = trio.Event()

    def refuse(self, reason: str) -> None:
        """End a cycle that could not load (no room for it): its waiters hear `reason`
        (`refusal`), and the model is unloaded again, not failed."""
        self.refusal = reason
        self._in_cycle = False
        self._stopped.set()  # the cycle never ran: an unload waiting for it has nothing to stop
        failed, self.failed = self.failed, trio.Event()
        failed.set()

    def fail(self, reason: str) -> None:
        """The current load or serving ended with an error other than the engine's refusal."""
        self.failure = reason
        self._in_cycle = False
        if not self._in_run:  # the cycle never ran (its load raised first): nothing to stop
            self._stopped.set()
        self.failed.set()

    async def settled(self, unless: trio.Event | None = None) -> None:
        """Return once the current load has ended: ready or failed; or once `unless` is set."""
        events = [self.ready, self.failed, *([unless] if unless is not None else [])]
        if any(event.is_set() for event in events):
            return
        async with trio.open_nursery() as nursery:

            async def wait(event: trio.Event) -> None:
                await event.wait()
                nursery.cancel_scope.cancel()

            for event in events:
                nursery.start_soon(wait, event)

    async def close(self) -> None:
        """Stop the scheduler and let the engine go; for the app's lifespan shutdown, once
        no handler can reach the engine. Waits for a step in flight to end first."""
        self._running.cancel()
        if self._started:
            await self._stopped.wait()

    async def unload(self, drain_timeout: float, message: str, code: str) -> int | None:
        """Hand the model to no new request ("unloading"), let the requests that hold
        it (its leases: they may still submit) and those in flight finish, for up to
        `drain_timeout` seconds, end the rest with Failed(`message`, `code`), then stop
        the scheduler and let the engine go; how many requests were ended, or None when
        no engine was serving (the load failed, or was called off). A load under way
        finishes first."""
        if not self._in_cycle:
            if self.failed.is_set():  # forget the failed load or serving: the next request tries again
                self.failed = trio.Event()
                self.failure = None
                if self.ready.is_set():  # it served before its scheduler failed: no engine now
                    self.ready = trio.Event()
            return None
        self._unloading = True
        try:
            await self.settled()
            cut: int | None = None
            serving = self.serving
            if serving is not None:
                with trio.move_on_after(drain_timeout):
                    await self.leases.none_held()
                    serving.scheduler.drain()
                    await serving.scheduler.idle()
                serving.scheduler.drain()
                cut = serving.scheduler.fail_all(message, code)
            del serving
            await self.close()
            self.ready = trio.Event()
            if self.failed.is_set():
                self.failed = trio.Event()
                self.failure = None
            if self._collect:  # the model outlived its last reference (run says why)
                self._collect = False
                gc.collect()
            # What the engine held is freed now; glibc keeps it unless asked to return it.
            await memory.return_free_memory()
        finally:
            self._unloading = False
        return cut

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        source = self.source or self.check()
        if not self._in_cycle:
            self.begin_cycle()
        self._started = True
        self._in_run = True
        task_status.started()
        try:
            with self._running:
                await self._serve(source)
        finally:
            released = self.serving is not None
            left_behind = None
            if self.serving is not None:
                self.earlier_totals = added_to(self.earlier_totals, self.serving.scheduler.stats())
                left_behind = weakref.ref(self.serving)
            self.serving = None  # the last reference outside the handlers: the pipeline goes
            if left_behind is not None and left_behind() is not None:
                # Still held: by a reference cycle, which only a full collection frees
                # (the pipeline with it), or by a handler yet to end. What gc.freeze()
                # set aside at ready is made collectable again, and the unload collects:
                # a pause of the event loop (docs/benchmarks.md#unloading-a-model).
                # Without a cycle (the scheduler's collaborators hold it weakly), nothing
                # pauses.
                gc.unfreeze()
                self._collect = True
            # "loaded" ends with the engine, however it ends (an unload, the server's
            # stop): a model said loaded with no engine would be picked, and picked
            # again, to make room. One whose scheduler failed stays failed (and said
            # unavailable, having been ready) until an unload forgets it.
            if self.ready.is_set() and not self.failed.is_set():
                self.ready = trio.Event()
            self._in_cycle = False
            self._in_run = False
            self._stopped.set()
            if released:
                log.info("engine released (%s)", source.name)
                if not self._unloading and self.released is not None:
                    self.released(source.name, "failed" if self.failed.is_set() else "stopped")

    async def _run_scheduler(
        self, scheduler: GenerationScheduler, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the scheduler; if its loop fails (nothing a request sends should make it,
        engine_admission.py fails that request alone), the model is marked failed: readiness
        and liveness say so, requests get a 503 that names the failure, and `ovtrio
        serve` exits once no model is left, for its supervisor to restart it."""
        try:
            await scheduler.run(task_status=task_status)
        except Exception as exc:  # any failure of the loop ends this model
            log.exception("the scheduler of %s stopped", self.model_name)
            reason = f"{type(exc).__name__}: {client_reason(exc)}"
            self.failure = f"its scheduler stopped after an internal error ({reason})"
            self.failed.set()

    async def _serve(self, source: ModelSource) -> None:
        began = time.perf_counter()
        try:
            if self.loading is not None:
                loading, self.loading = self.loading, None
            else:
                loading = self._loader([(source, self.settings)])[0]
            model, kv_capacity = await loaded_within_deadline(loading)
            stateful = engine_backend(self.settings) == "stateful"
            step = (
                None
                if stateful
                else await trio.to_thread.run_sync(
                    choose_step,
                    model.pipeline,
                    self.settings.gil_free_step,
                    partial(apply_defaults, speculation=model.speculation),
                    source.vision,
                )
            )
        except ModelLoadError as exc:
            self.failure = str(exc)
            log.error("%s", exc)
            self.failed.set()
            return
        self.load_seconds = time.perf_counter() - began
        log.info("%s", load_summary(model))
        observer = (
            self._observer(source.name, source.context_length, model.speculation.enabled) if self._observer else None
        )
        self.serving = serving_model(source, self.settings, model, kv_capacity, step, observer)
        scheduler = self.serving.scheduler
        async with trio.open_nursery() as nursery:
            await nursery.start(self._run_scheduler, scheduler)
            self.ready.set()
            await settle_memory()
            where = f" at {self.base_url}/v1 and {self.base_url}/v3" if self.base_url else ""
            log.info(
                "serving %s as '%s' on %s (loaded in %.1f s, context %d tokens)%s",
                source.path.name,
                source.name,
                model.device,
                model.load_seconds,
                source.context_length,
                where,
            )
