"""Which models are loaded: a model loads when a request names it, and unloads when
it has been idle for its keep-alive time, when room is needed for another
(--models-max: the least recently used one running no request), or when a client asks
(POST /models/unload). llama-server's router mode and Ollama's keep_alive work so.
The encoders (embedding, rerank, Whisper; ovtrio/embedding/on_demand.py) follow the
same rules, --models-max counts them, and their loads take their turn and make room
(room_for). A failed load is not tried again at once (ovtrio/lifecycle/load_retry.py).

One load at a time (a lock): on 2 cores a second compile beside the first only slows
both, and --models-max is kept by counting what is loaded while nothing else loads (a
load waiting its turn holds no room: counted, it would make the load ahead of it wait
for loads that cannot begin before it ends). An unload asked while the load waits calls
it off. The load runs in a task of the residency's own nursery, never in a request's:
the requests that want the model wait for it to settle (ModelService.settled), a request
that leaves stops waiting and nothing more, and when the load fails each waiting request
is told why, once. The engine work runs in a worker thread (ModelService._serve), so the
event loop, /health and the other models go on serving meanwhile.

A model is in use while a request holds a lease on it (ovtrio/lifecycle/lease.py: from the moment the
model is handed to the request until its response has ended, whether or not the engine
holds it yet), and is never unloaded as idle or to make room then: a load waits, up to
--models-load-wait seconds, for a model to become idle, and then its waiters get a 503
with Retry-After. An unload lets the model's leases end and its requests finish first
(up to the drain timeout; ended with an error after).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio

from ovtrio.embedding.on_demand import OnDemandEncoder, Refusal
from ovtrio.engine.errors import client_reason
from ovtrio.lifecycle.lease import Lease
from ovtrio.lifecycle.resident import ModelState, Resident
from ovtrio.model import ModelLoadError
from ovtrio.serving import memory
from ovtrio.serving.failed_loads import FailedLoads
from ovtrio.serving.kinds import is_generation
from ovtrio.serving.metrics import LifecycleMetrics
from ovtrio.serving.residency_errors import Busy, LoadFailed, NoRoom, NotLoaded, Stopping
from ovtrio.serving.service import ModelService, ServingModel

__all__ = ["Busy", "LoadFailed", "NoRoom", "NotLoaded", "Residency", "ResidencyRules", "Stopping"]

log = logging.getLogger("ovtrio")

# Failed.code of the requests an unload ended (the API layer words it for clients).
MODEL_UNLOADED = "model_unloaded"


@dataclass(frozen=True)
class ResidencyRules:
    models_max: int  # 0: no limit
    autoload: bool
    load_wait: float
    idle_unload: float | None  # None: keep loaded
    drain_timeout: float
    # How often idle models are looked for, and a waiting load or a request waiting for
    # an unload looks again, in seconds of trio's clock.
    idle_check: float = 0.25
    room_check: float = 0.1


class Residency:
    def __init__(
        self,
        services: Callable[[], Sequence[ModelService]],
        rules: ResidencyRules,
        metrics: LifecycleMetrics | None = None,
        encoders: Callable[[], Sequence[OnDemandEncoder[Any]]] = list,
        stopping: trio.Event | None = None,
    ) -> None:
        """`services` and `encoders` give the models as they are now (a models_dir's
        change). `stopping`: set when the server begins to shut down (its drain)."""
        self._services = services
        self._encoders = encoders
        self._stopping = stopping if stopping is not None else trio.Event()
        self.rules = rules
        self._metrics = metrics
        self._lock = trio.Lock()
        # Models whose load waits for its turn (the lock): no engine yet, and no room taken.
        self._queued: set[ModelService] = set()
        self._nursery: trio.Nursery | None = None
        self.failed_loads = FailedLoads()  # the registry forgets a model there too
        self._unloads: dict[ModelService, trio.Event] = {}  # unloads under way, set when each ends
        self._checks: dict[ModelService, trio.Event] = {}  # checks of files under way (load), likewise

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Runs before the models loaded at start begin loading: their loads are counted
        (and their keep-alive time starts when they are loaded) as those it makes."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._unload_idle)
            for service in self._services():
                self._watch(service)
                if service.state == "loading":
                    nursery.start_soon(self._settle, service)
            task_status.started()

    def _watch(self, service: ModelService) -> None:
        """Count the engines `service` releases but not by an unload, as unloads."""
        if self._metrics is not None:
            service.released = self._metrics.unloaded

    async def _settle(self, service: ModelService) -> None:
        """Wait for the load under way to end; then count it, and the model's idle time starts."""
        await service.settled()
        if self._stopping.is_set() and service.serving is not None:  # loaded during the drain
            service.serving.scheduler.drain()  # which did not see it: it takes no request either
        service.last_used = trio.current_time()
        self.failed_loads.settled(service)
        if self._metrics is None:
            return
        if service.ready.is_set() and service.load_seconds is not None:
            self._metrics.loaded(service.model_name, service.load_seconds)
        else:
            self._metrics.load_failed(service.model_name)

    async def take_lease(self, service: ModelService, keep_alive: float | None = None) -> tuple[ServingModel, Lease]:
        """The loaded model of `service` (acquire) and a lease on it, taken in the step
        that finds it loaded: in use until the caller releases it (lease.py)."""
        serving = await self.acquire(service, keep_alive)
        return serving, service.leases.take(partial(_used_now, service))

    @asynccontextmanager
    async def lease(self, service: ModelService, keep_alive: float | None = None) -> AsyncIterator[ServingModel]:
        """take_lease, released when the block ends."""
        serving, lease = await self.take_lease(service, keep_alive)
        try:
            yield serving
        finally:
            lease.release()

    async def acquire(self, service: ModelService, keep_alive: float | None = None) -> ServingModel:
        """The loaded model of `service`, loading it first if need be (and allowed); with
        no lease on it (take_lease), idle at the next checkpoint. `keep_alive`: seconds
        it may stay loaded idle after this request (negative: for good; None: the
        server's model_idle_unload). Raises NotLoaded, LoadFailed, NoRoom, or Stopping
        once the server stops, at once even while the load goes on (shutdown.py)."""
        while True:
            state = service.state
            serving = service.serving
            if state == "loaded" and serving is not None:
                service.last_used = trio.current_time()
                service.keep_alive = keep_alive
                return serving
            if state == "loaded":  # its serving has just ended (the server stops)
                raise LoadFailed(service.failure or "it stopped serving", 1)
            if self._stopping.is_set():
                raise Stopping()
            if state == "unloading":
                await trio.sleep(self.rules.room_check)
                continue
            if state in ("unloaded", "failed"):
                if not self.rules.autoload:
                    if state == "failed":
                        raise LoadFailed(service.failure or "it failed to load", self.failed_loads.retry_after(service))
                    raise NotLoaded()
                await self.load(service)
            await service.settled(unless=self._stopping)
            if self._stopping.is_set():
                raise Stopping()
            if service.ready.is_set():
                continue
            if service.refusal is not None:
                raise NoRoom(service.refusal, max(1, round(self.rules.load_wait / 2)))
            raise LoadFailed(service.failure or "it failed to load", self.failed_loads.retry_after(service))

    def loaded(self, service: ModelService) -> ServingModel | None:
        """The loaded model of `service` as it is now, or None: no load begins, and the
        model's idle time goes on (a read that does not use it keeps it no longer)."""
        if service.state == "loaded":
            return service.serving
        return None

    async def load(self, service: ModelService) -> None:
        """Begin loading `service` (unless it is loaded or loading), in a task of the
        residency's nursery for the work. A model unusable when found, or whose files
        changed since they were checked, is checked again first, its files read in a
        worker thread (one check at a time per model: a request that comes meanwhile
        waits for it); the check's failure fails the model, with the reason."""
        while (under_way := self._checks.get(service)) is not None:
            await under_way.wait()
        if service.state in ("loading", "loaded", "unloading"):
            return
        if self.failed_loads.too_soon(service):  # its waiters hear why it failed
            return
        if service not in self._services():  # forgotten (its file gone) while its request waited
            return service.fail("its file is gone from the models folder")
        checking = self._checks[service] = trio.Event()
        try:
            # Unusable when found, or replaced since: checked again.
            stale = service.source is None or await trio.to_thread.run_sync(service.files_changed)
            if stale and not await self._checked(service):
                return
            if service.state in ("loading", "loaded", "unloading"):
                return
            assert self._nursery is not None, "the residency runs before requests are served"
            self._watch(service)
            service.begin_cycle()
            self._queued.add(service)
            self._nursery.start_soon(self._load, service)
        finally:
            del self._checks[service]
            checking.set()

    async def _checked(self, service: ModelService) -> bool:
        """Check `service`'s files again, in a worker thread; False (the model failed,
        with the reason) if they cannot serve."""
        try:
            await service.check_in_thread()
        except ModelLoadError as exc:
            log.warning("%s", exc)
            service.failure = str(exc)
            service.failed.set()
            return False
        except Exception as exc:  # an unforeseen failure of its files fails this model alone
            log.exception("cannot read the model %s", service.model_name)
            service.failure = f"cannot read model {service.model_name}: {type(exc).__name__}: {client_reason(exc)}"
            service.failed.set()
            return False
        return True

    async def unload(self, service: ModelService, reason: str, *, wait: bool = True) -> int:
        """Unload `service` (see ModelService.unload); with `wait` False, refuse (Busy)
        while it runs requests. `reason` (request, idle, lru) goes to the log and the
        metrics. How many requests were ended.

        It runs in the residency's nursery: a client that leaves while the model drains
        cannot cut it short (leaving the model refusing requests, or with no engine)."""
        under_way = self._unloads.get(service)
        if under_way is not None:  # asked twice at once: one unload, counted once
            await under_way.wait()
            return 0
        if service.state in ("unloaded", "unloading"):
            return 0
        if not wait and (service.in_flight or service.leases.held):
            raise Busy(f"The model '{service.model_name}' runs {max(service.in_flight, service.leases.held)} requests.")
        # Marked before the first checkpoint: a second caller in the same scheduling batch
        # (two clients, the idle loop and a load making room) finds it and waits.
        done = self._unloads[service] = trio.Event()
        outcome: list[int | Exception] = []

        async def unload_in_nursery() -> None:
            try:
                outcome.append(await self._unload_now(service, reason))
            except Exception as exc:  # the caller hears of it; the residency goes on
                log.exception("unloading %s failed", service.model_name)
                outcome.append(exc)
            finally:
                del self._unloads[service]
                done.set()

        if self._nursery is None:
            await unload_in_nursery()
        else:
            self._nursery.start_soon(unload_in_nursery)
            await done.wait()
        result = outcome[0] if outcome else 0
        if isinstance(result, Exception):
            raise result
        return result

    async def _unload_now(self, service: ModelService, reason: str) -> int:
        cut = await service.unload(
            self.rules.drain_timeout,
            f"The model '{service.model_name}' was unloaded before this request finished; retry it.",
            MODEL_UNLOADED,
        )
        if cut is None:  # nothing was serving: a load failed, or was called off before it began
            return 0
        log.info("unloaded %s (%s)%s", service.model_name, reason, f", ending {cut} requests" if cut else "")
        if self._metrics is not None:
            self._metrics.unloaded(service.model_name, reason)
        return cut

    async def _load(self, service: ModelService) -> None:
        try:
            await self._load_in_turn(service)
        except Exception as exc:  # whatever a load does, the other models and loads go on
            log.exception("loading %s failed", service.model_name)
            service.fail(f"{type(exc).__name__}: {client_reason(exc)}")
            if self._metrics is not None:
                self._metrics.load_failed(service.model_name)

    async def _load_in_turn(self, service: ModelService) -> None:
        async with self._lock:
            self._queued.discard(service)
            room = await self._make_room(service)
            if self._stopping.is_set():
                service.refuse("The server is shutting down and loads no model; retry shortly.")
                return
            if service.state == "unloading":  # unloaded while it waited its turn: nothing to load
                service.refuse(f"The model '{service.model_name}' was unloaded before its load began; retry shortly.")
                return
            if not room:
                service.refuse(self._no_room(service))
                log.warning("no room to load %s: every loaded model runs requests", service.model_name)
                return
            assert self._nursery is not None
            self._nursery.start_soon(self._serve, service)
            await self._settle(service)

    async def _serve(self, service: ModelService) -> None:
        """Run `service` until it is unloaded; whatever it raises fails that model alone."""
        try:
            await service.run()
        except Exception as exc:
            log.exception("the model %s stopped", service.model_name)
            service.fail(f"{type(exc).__name__}: {client_reason(exc)}")

    def _resident(self, loading: object) -> list[ModelService | OnDemandEncoder[Any]]:
        """The models that hold an engine, or load one now, beside `loading`: generation
        models loaded, loading or unloading (not those whose load waits its turn behind
        it), and encoders loaded (an encoder loads only in its turn, room_for)."""
        services = [
            s
            for s in self._services()
            if s is not loading and s not in self._queued and s.state in ("loaded", "loading", "unloading")
        ]
        encoders = [e for e in self._encoders() if e is not loading and e.loaded.is_set()]
        return [*services, *encoders]

    def _no_room(self, loading: ModelService | OnDemandEncoder[Any]) -> str:
        busy = [model.name for model in self._resident(loading)]
        return (
            f"The model '{loading.name}' cannot be loaded now: {len(busy)} models are loaded"
            f" (--models-max {self.rules.models_max}) and each runs requests ({', '.join(busy)}). Retry shortly."
        )

    async def _make_room(self, loading: ModelService | OnDemandEncoder[Any]) -> bool:
        """Unload least recently used idle models until `loading` fits under models_max;
        False if none became idle within load_wait seconds."""
        if not self.rules.models_max:
            return True
        deadline = trio.current_time() + self.rules.load_wait
        # Models an unload left resident: not picked again (and each try awaits).
        kept: set[ModelService | OnDemandEncoder[Any]] = set()
        while loading.state != ModelState.UNLOADING:  # an unload calls the load off
            if self._stopping.is_set():
                return False
            resident = self._resident(loading)
            if len(resident) < self.rules.models_max:
                return True
            now = trio.current_time()
            idle = [model for model in resident if model.idle and model not in kept]
            if idle:
                oldest = min(idle, key=lambda model: model.last_used)
                await self._unload_any(oldest, "lru")
                await trio.lowlevel.checkpoint()
                if oldest in self._resident(loading):
                    kept.add(oldest)
                continue
            if now >= deadline:
                return False
            await trio.sleep(self.rules.room_check)
        return False

    @asynccontextmanager
    async def room_for(self, encoder: OnDemandEncoder[Any]) -> AsyncIterator[None]:
        """An encoder's load, in its turn (one load at a time) and with room for it
        under models_max, as a generation model's; raises Refusal when no room came
        within load_wait seconds. Without models_max, an encoder loads at once."""
        if not self.rules.models_max:
            yield
            return
        async with self._lock:
            if self._stopping.is_set():
                raise Refusal("The server is shutting down and loads no model; retry shortly.", 1)
            room = await self._make_room(encoder)
            if self._stopping.is_set():
                raise Refusal("The server is shutting down and loads no model; retry shortly.", 1)
            if not room:
                raise Refusal(self._no_room(encoder), max(1, round(self.rules.load_wait / 2)))
            yield

    async def _unload_idle(self) -> None:
        """Unload each model idle for longer than its keep-alive time. A model running
        requests counts as used until they end."""
        while True:
            await trio.sleep(self.rules.idle_check)
            await self._unload_idle_now()

    async def _unload_idle_now(self) -> None:
        """One look for idle models. An unload that fails leaves that model as it is
        (logged); the others, and the residency, go on."""
        now = trio.current_time()
        models: list[ModelService | OnDemandEncoder[Any]] = [*self._services(), *self._encoders()]
        for model in models:
            if model.state != ModelState.LOADED:
                continue
            if not model.idle:  # used until its requests end
                model.last_used = now
                continue
            keep = model.keep_alive if model.keep_alive is not None else self.rules.idle_unload
            if keep is not None and keep >= 0 and now - model.last_used >= keep:
                with _logged(f"unloading {model.name}"):
                    await self._unload_any(model, "idle")

    async def _unload_any(self, model: ModelService | OnDemandEncoder[Any], reason: str) -> None:
        """Unload `model`, idle, whatever its kind."""
        if is_generation(model):
            await self.unload(model, reason)
        else:
            await self.unload_encoder(model, reason)

    async def unload_encoder(self, encoder: OnDemandEncoder[Any], reason: str, *, drain: bool = False) -> bool:
        """Unload `encoder` unless it is busy, or with `drain` once it is not (at most
        drain_timeout later), and return its memory to the system; whether it did. One
        under way is waited for, and counted once; a client that leaves while it drains
        calls it off."""
        began = encoder.unload()
        if not began and drain and encoder.loaded.is_set() and not encoder.unloading:
            await encoder.drained(self.rules.drain_timeout)
            began = encoder.unload(busy=True)
        if not began:
            if encoder.loaded.is_set() and not encoder.unloading:  # busy
                return False
            await encoder.unloaded()  # another unload came first
            return True
        if self._metrics is not None:
            self._metrics.unloaded(encoder.name, reason)
        await encoder.unloaded()
        await memory.return_free_memory()
        return True


@contextmanager
def _logged(what: str) -> Iterator[None]:
    try:  # logged, and the residency goes on
        yield
    except Exception:
        log.exception("%s failed", what)


def _used_now(model: Resident) -> None:
    """A lease on `model` was given back: its idle time starts now."""
    model.last_used = trio.current_time()
