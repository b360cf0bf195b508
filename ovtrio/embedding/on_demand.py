"""What every encoder the server serves (an embedding model, a reranker, a Whisper model)
does to be loaded on demand: it loads on its first request (or at start with
`encoder_preload`), serves its worker's queue (worker.py) until it is unloaded (idle, or
by hand: ovtrio/serving/residency.py decides), and loads again on the next request.

A load that fails fails the requests waiting for it, with the reason, and leaves the
model "failed" with that reason (listed so); a request after RETRY_AFTER seconds (or
once the model's files changed) tries the load again, as a generation model's does
(ovtrio/lifecycle/load_retry.py says why not sooner). Whatever the load raises, the model
is failed and nothing else: the other models go on serving.
"""

from __future__ import annotations

import gc
import logging
import time
import weakref
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import trio

from ovtrio.embedding.kinds import ModelKind
from ovtrio.embedding.worker import EncoderUnavailable, EncoderWorker, WorkerStats
from ovtrio.engine.errors import client_reason
from ovtrio.lifecycle.lease import Lease, LeaseCount
from ovtrio.lifecycle.load_retry import FailedLoad
from ovtrio.lifecycle.resident import ModelState
from ovtrio.model.shown_paths import without_model_path
from ovtrio.model.source import ModelLoadError
from ovtrio.scheduler import SHUTTING_DOWN
from ovtrio.settings.server import Settings

log = logging.getLogger("ovtrio")

Model = TypeVar("Model")

# Seconds between two looks at a draining model's queue (unloaded once it is empty).
# Polled, not awaited as an event: whether the model is idle changes in three places
# (the queue, the batch in the thread, the model's own unload), and a batch takes
# milliseconds to seconds, so 50 ms adds little to a drain bounded by its timeout.
DRAIN_CHECK = 0.05


class LoadObserver(Protocol):
    """What is told of each load (the metrics: ovtrio/serving/metrics.py LifecycleMetrics)."""

    def loaded(self, model_name: str, seconds: float) -> None: ...

    def load_failed(self, model_name: str) -> None: ...


class Refusal(Exception):
    """No room to load the model now (--models-max); the message says why."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


EncoderLoader = Callable[["OnDemandEncoder[Any]"], Any]
"""The one seam between an encoder's lifecycle and its engine: builds the model of the
encoder given (its name, kind, settings and folder say which), in a worker thread, and
returns it for the encoder's worker to compute on (the worker's batch function of its
kind takes it). It may block for as long as the load takes; it raises ModelLoadError
(one line, the model's requests hear it), and anything else it raises fails the model
too. The server's is load_encoder, each kind's own build; tests give one that builds
a fake."""


def load_encoder(encoder: OnDemandEncoder[Model]) -> Model:
    """The model of `encoder`, built by its kind from its folder (the engine's load)."""
    return encoder._load()


# Holds a load's turn (and its room under --models-max) while the model loads; raises
# Refusal when there is no room. Set by the registry (Residency.room_for).
Admission = Callable[["OnDemandEncoder[Any]"], AbstractAsyncContextManager[None]]


class OnDemandEncoder(Generic[Model]):
    kind: ModelKind

    def __init__(self, name: str, settings: Settings, folder: Path | None, worker: EncoderWorker[Model]) -> None:
        self.name = name
        self.settings = settings
        self.folder = folder
        self.worker = worker
        self.started_at = time.time()
        self.model: Model | None = None
        self.failure: str | None = None
        self.load_seconds: float | None = None
        self.loaded = trio.Event()
        self._wanted = trio.Event()
        # When a request last came (trio's clock), and the scope its serving runs in:
        # cancelled, the model is unloaded (unload), and loads again on the next request.
        self.last_used = 0.0
        self.keep_alive: float | None = None  # a request's keep_alive: none sets an encoder's
        # The requests that hold the model now (ovtrio/lifecycle/lease.py): in use while one is out.
        self.leases = LeaseCount()
        self._serving = trio.CancelScope()
        # Set (and replaced) whenever a load ends, loaded or failed, and when an unload
        # ends: what settled() and unloaded() wait on.
        self._changed = trio.Event()
        # Told of each load's end; set by the registry (the lifecycle metrics).
        self.load_observer: LoadObserver | None = None
        # What a load waits for first (its turn, and room for it); None: it loads at once.
        self.admission: Admission | None = None
        self._refused: Refusal | None = None  # why the last load found no room
        self._failed_load: FailedLoad | None = None  # when it last failed, and its files then
        # What builds the model at each load (in a worker thread); set by the registry.
        self.loader: EncoderLoader = load_encoder

    def stats(self) -> WorkerStats:
        return self.worker.stats()

    @property
    def state(self) -> ModelState:
        """As a generation model's (ModelService.state)."""
        if self.failure is not None:
            return ModelState.FAILED
        if self.unloading:
            return ModelState.UNLOADING
        if self.loaded.is_set():
            return ModelState.LOADED
        return ModelState.LOADING if self._wanted.is_set() else ModelState.UNLOADED

    @property
    def idle(self) -> bool:
        """Loaded, no lease out, and nothing computing or waiting (a large job between
        two of its parts included: unloaded then, it would wait for a load nothing asks
        for)."""
        return self.loaded.is_set() and not self.leases.held and not self.worker.has_work

    def take_lease(self) -> Lease:
        """A lease for a request that will use the model (released by the caller, which
        starts the model's idle time)."""
        return self.leases.take(self._used_now)

    def _used_now(self) -> None:
        self.last_used = trio.current_time()

    def want(self) -> None:
        """A request needs the model: load it unless it is loaded or loading; after a
        failed load, try again, unless it failed a moment ago and its files are as they
        were (its requests then hear the failure: the worker was closed with it)."""
        self.last_used = trio.current_time()
        if self.failure is not None and not self._wanted.is_set():
            if self._failed_load is not None and self._failed_load.too_soon(self.folder):
                return
            self._forget_failure()
        self._wanted.set()

    def fail(self, reason: str) -> None:
        """The model cannot serve (its load failed, or its folder is unusable): its
        requests, now and until a retry, hear `reason` (its folder named, not its path:
        shown_paths.py)."""
        reason = without_model_path(reason, self.folder)
        self.failure = reason
        self._failed_load = FailedLoad.now(self.folder)
        self.worker.close(
            EncoderUnavailable(
                f"The model '{self.name}' failed to load: {reason}",
                "model_unavailable",
                self._failed_load.retry_after(),
            )
        )

    @property
    def retry_after(self) -> int | None:
        """Seconds until a failed model is loaded again; None unless it failed."""
        if self.failure is None:
            return None
        return self._failed_load.retry_after() if self._failed_load is not None else 1

    def _forget_failure(self) -> None:
        self.failure = None
        self._failed_load = None
        self.worker.reopen()

    @property
    def unloading(self) -> bool:
        """Its unload has begun (unload) and its worker has yet to stop."""
        return self.loaded.is_set() and self._serving.cancel_called

    def unload(self, *, busy: bool = False) -> bool:
        """Unload the model if it computes nothing now, or with `busy` whatever it
        computes (the batch in the thread ends first; what is queued stays queued and
        loads the model again); or forget a failed load. Whether it did."""
        if self.failure is not None and not self._wanted.is_set():
            self._forget_failure()
            return True
        if not self.loaded.is_set() or self._serving.cancel_called:  # not loaded, or its unload is under way
            return False
        if not busy and not self.idle:
            return False
        self._serving.cancel()
        return True

    async def drained(self, within: float) -> None:
        """Return once the model computes nothing and has nothing queued (or is no
        longer loaded), or after `within` seconds."""
        with trio.move_on_after(within):
            while self.loaded.is_set() and not self.idle:  # noqa: ASYNC110 (see DRAIN_CHECK)
                await trio.sleep(DRAIN_CHECK)

    def for_shutdown(self) -> ShutdownDrain:
        """The model as the server's drain on shutdown sees it (ovtrio/serving/shutdown.py)."""
        return ShutdownDrain(self)

    async def settled(self) -> Refusal | None:
        """Return once the model is loaded or its load has failed (loading it first);
        the refusal when its load found no room."""
        self.want()
        while not self.loaded.is_set() and self.failure is None:
            await self._changed.wait()
            if self._refused is not None:
                return self._refused
        return None

    async def unloaded(self) -> None:
        """Return once the model is no longer loaded (after unload)."""
        while self.loaded.is_set():
            await self._changed.wait()

    def _announce(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    def _load(self) -> Model:
        """The model, loaded by the engine from the encoder's folder (in a worker thread:
        load_encoder). Raises ModelLoadError."""
        raise NotImplementedError

    def _serving_now(self, model: Model) -> None:
        """The model has just loaded (before any request runs on it)."""

    def _limits(self, model: Model) -> str:
        """What the "serving" log line says of the model besides its load time."""
        return ""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        if self.settings.encoder_preload:
            self._wanted.set()
        try:
            while True:
                await self._wanted.wait()
                await self._serve()
                # Unloaded, or failed: requests that come now wait in the queue for the next load.
                self._wanted = trio.Event()
                if self.worker.has_work:
                    self._wanted.set()
        finally:
            self.worker.close(EncoderUnavailable("The server is shutting down; retry shortly.", "shutting_down"))
            self.model = None

    async def _serve(self) -> None:
        """Load the model and compute requests until unloaded (or the load fails, or
        finds no room)."""
        self._refused = None
        try:
            async with self.admission(self) if self.admission is not None else nullcontext():
                model = await self._load_in_thread()
        except Refusal as exc:  # the requests waiting hear why; the model stays unloaded
            log.warning("no room to load %s model '%s'", self.kind, self.name)
            self.worker.fail_queued(EncoderUnavailable(str(exc), "model_unavailable", exc.retry_after))
            self._refused = exc
            self._announce()
            return
        if model is not None:
            await self._serve_loaded(model)

    async def _load_in_thread(self) -> Model | None:
        """The model, loaded; None (and the model failed) if its load failed."""
        log.info("loading %s model '%s'", self.kind, self.name)
        try:
            model: Model = await trio.to_thread.run_sync(self.loader, self)
            return model
        except Exception as exc:  # whatever a load raises fails this model alone
            reason = str(exc) if isinstance(exc, ModelLoadError) else f"{type(exc).__name__}: {client_reason(exc)}"
            if not isinstance(exc, ModelLoadError):
                log.exception("loading %s model '%s' failed", self.kind, self.name)
            self.fail(reason)
            log.error("%s", reason)
            if self.load_observer is not None:
                self.load_observer.load_failed(self.name)
            self._announce()
            return None

    async def _serve_loaded(self, model: Model) -> None:
        """Compute requests on the loaded `model` until it is unloaded."""
        self.model = model
        self.load_seconds = getattr(model, "load_seconds", None)
        self._serving_now(model)
        # Its idle time starts now (a preloaded model was named by no request).
        self.last_used = trio.current_time()
        self.loaded.set()
        self._announce()
        if self.load_observer is not None and self.load_seconds is not None:
            self.load_observer.loaded(self.name, self.load_seconds)
        log.info(
            "serving %s model '%s' (loaded in %.2f s%s)",
            self.kind,
            self.name,
            self.load_seconds or 0.0,
            self._limits(model),
        )
        self._serving = trio.CancelScope()
        with self._serving:
            await self.worker.run(model)
        self.loaded = trio.Event()
        self.model = None
        try:
            left_behind: weakref.ref[Model] | None = weakref.ref(model)
        except TypeError:  # an object no weak reference can point at: taken as held
            left_behind = None
        del model
        self._announce()
        if left_behind is None or left_behind() is not None:
            # Still held, by a reference cycle: its memory goes now, not at some later
            # collection. A model that became ready meanwhile froze what existed then
            # (serving/service.py), this encoder too, which the collection would not
            # see. (Without a cycle it is gone already, with no collection's pause.)
            gc.unfreeze()
            gc.collect()
        log.info("unloaded %s model '%s'", self.kind, self.name)


class ShutdownDrain:
    """An encoder's part in the drain on shutdown, as a generation scheduler's
    (drain / in_flight / idle / fail_all): its jobs computing, queued or between two of
    their parts run on, up to the drain timeout, and are ended with a shutting_down
    error after it. Jobs queued for a load (the model was not serving when the drain
    began) hear at once that the server is shutting down, as generation requests
    waiting for their model's load do (ovtrio/serving/shutdown.py says why)."""

    def __init__(self, encoder: OnDemandEncoder[Any]) -> None:
        self._encoder = encoder
        self._worker = encoder.worker

    def drain(self) -> None:
        """Begin the drain. New jobs are refused before they reach the worker (the API
        checks the drain), so only those waiting for a load are ended here."""
        if not self._encoder.loaded.is_set() or self._encoder.unloading:
            self._worker.close(EncoderUnavailable("The server is shutting down; retry shortly.", SHUTTING_DOWN))

    @property
    def in_flight(self) -> int:
        return self._worker.jobs

    async def idle(self) -> None:
        """Return once no job computes or waits (polled: see DRAIN_CHECK)."""
        while self._worker.has_work:  # noqa: ASYNC110 (see DRAIN_CHECK)
            await trio.sleep(DRAIN_CHECK)

    def fail_all(self, message: str, code: str = SHUTTING_DOWN) -> int:
        """End every job still computing or waiting with `message`; how many."""
        return self._worker.cut(EncoderUnavailable(message, code))


def encoder_hints(settings: Settings) -> dict[str, Any]:
    """The engine properties an encoder is compiled with: the plugin config, the encoders'
    precision hint and the thread count."""
    hints = dict(settings.plugin_config)
    if settings.encoder_inference_precision != "auto":
        hints["INFERENCE_PRECISION_HINT"] = settings.encoder_inference_precision
    if settings.num_threads is not None:
        hints["INFERENCE_NUM_THREADS"] = str(settings.num_threads)
    return hints
