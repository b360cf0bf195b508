"""The models a server serves, found by the name requests give in `model`.

One ModelService per model (ovtrio/serving/service.py), in the order of the config file (or the
one model of the flags). The models load one after the other in one thread
(start_loading_in_order): on 2 cores a second load at the same time would only slow
the first, and a GGUF file the first converts is in the model cache for the next. Each
serves as soon as it is loaded, while the next still loads.

Startup stops at once, with one line, when a model's path is unusable (checked before
any load). A model that fails while loading is logged in one line and stays failed:
requests for it get a 503 and readiness reports it, while the others serve. When every
model has failed there is nothing to serve, and the launcher exits as it does for one.

Models may also load on demand (ovtrio/serving/residency.py): those of a models_dir
(ovtrio/serving/discovery.py) wait for their first request, and any model, one loaded
at start included, may be unloaded and loaded again. The encoders (embedding, rerank
and Whisper models) always load on demand, those of the flags and config file as those
found in a models_dir; each runs in a task of the registry's nursery, waiting for its
first request. Readiness counts only the models that load at start, and only their
first load: a server whose folder models are unloaded takes requests.

The shutdown state is the server's, shared by every model: the drain refuses new work
for all of them and waits for the requests in flight on each (ovtrio/serving/shutdown.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import trio

from ovtrio.embedding.kinds import ModelKind
from ovtrio.embedding.on_demand import EncoderLoader, load_encoder
from ovtrio.embedding.worker import EncoderObserver
from ovtrio.lifecycle.lease import Lease
from ovtrio.loading import ModelLoad, start_loading_in_order
from ovtrio.model import ModelLoadError
from ovtrio.model.source import check_model_name
from ovtrio.scheduler import RequestObserver
from ovtrio.serving.discovery import FolderModel, settings_for
from ovtrio.serving.folder_reading import Reading, ReadingsDue, read_folder
from ovtrio.serving.kinds import Encoder, build_encoder, check_encoder
from ovtrio.serving.metrics import LifecycleMetrics
from ovtrio.serving.residency import Residency, ResidencyRules
from ovtrio.serving.service import Loader, ModelService, ObserverFactory, ServingModel
from ovtrio.serving.shutdown import Shutdown
from ovtrio.settings.server import Settings

log = logging.getLogger("ovtrio")

ModelStatus = Literal["loading", "ready", "failed", "draining", "unloaded", "unloading"]


def rules_of(settings: Settings) -> ResidencyRules:
    return ResidencyRules(
        models_max=settings.models_max,
        autoload=settings.models_autoload,
        load_wait=settings.models_load_wait,
        idle_unload=settings.model_idle_unload,
        drain_timeout=settings.drain_timeout,
    )


class ModelRegistry:
    def __init__(
        self,
        models: Sequence[Settings],
        drain_timeout: float,
        observer: ObserverFactory | None = None,
        loading: Sequence[ModelLoad] | None = None,
        encoders: Sequence[Encoder] = (),
        models_dir: Settings | None = None,
        rules: ResidencyRules | None = None,
        lifecycle: LifecycleMetrics | None = None,
        encoder_observer: Callable[[str, ModelKind], EncoderObserver] | None = None,
        on_rescan: Callable[[], None] | None = None,
        on_forget: Callable[[str], None] | None = None,
        loader: Loader = start_loading_in_order,
        encoder_loader: EncoderLoader = load_encoder,
    ) -> None:
        """`models`: each model's settings (config_file.model_settings), loaded at start.
        `observer` makes each model's request observer (the metrics), `encoder_observer`
        each encoder's. `loading`, when given, is the load of each model already under
        way (start_loading_in_order), in the same order. `encoders`: those of the flags
        and the config file. `models_dir`: the settings whose models_dir holds more
        models, loaded on demand (their defaults too). `rules`: when models load and
        unload. `on_rescan` is called after each reading of models_dir: what the server
        serves may have changed. `on_forget` is called with the name of each model of
        models_dir the server forgets (its file gone): its metrics go with it. `loader`
        starts each generation model's load, `encoder_loader` builds each encoder's
        model at each of its loads (service.py's Loader, on_demand.py's EncoderLoader)."""
        self._observer = observer
        self._loader = loader
        self._encoder_loader = encoder_loader
        self._preloaded = loading is not None
        futures = list(loading) if loading is not None else [None] * len(models)
        self.services = [
            ModelService(settings, observer=self._observer_of if observer else None, loading=future, loader=loader)
            for settings, future in zip(models, futures)
        ]
        self._at_start = list(self.services)
        self._folder_defaults = models_dir
        self.encoders: list[Encoder] = list(encoders)
        self._lifecycle = lifecycle
        self._encoder_observer = encoder_observer
        # The encoders found in models_dir, each with the scope of its task (cancelled
        # when its folder is gone), and those whose task has yet to start.
        self._found_encoders: dict[str, trio.CancelScope] = {}
        self._unstarted: list[Encoder] = []
        self._nursery: trio.Nursery | None = None
        self.shutdown = Shutdown(drain_timeout)
        self.residency = Residency(
            lambda: self.services,
            rules or ResidencyRules(0, True, 30.0, None, drain_timeout),
            lifecycle,
            lambda: self.encoders,
            self.shutdown.draining,
        )
        for encoder in self.encoders:
            self._govern(encoder)
        # Set when every model has failed to load: the server has nothing to serve.
        self.failed = trio.Event()
        self._by_name: dict[str, ModelService] = {}
        self._checked = False
        self._longest_context = 0
        self._running = trio.CancelScope()
        self._on_rescan = on_rescan
        self._readings = ReadingsDue()
        # Set when the reading under way ends; None when none is.
        self._reading: trio.Event | None = None
        # The names the last reading found: a model gone from the folder is forgotten
        # once it is unloaded, whether or not the folder is read again by then.
        self._found_names: frozenset[str] | None = None
        self._forget = on_forget or (lambda name: None)

    def check(self) -> None:
        """Resolve and check every model's path; raises ModelLoadError (one line) for the
        first unusable one, or when two models would be served under one name."""
        self._checked = True
        for service in self._at_start:
            source = service.check()
            if source.name in self._by_name:
                raise ModelLoadError(f"two models are served as '{source.name}'; give each its own served_model_name")
            self._by_name[source.name] = service
            self._longest_context = max(self._longest_context, source.context_length)
        names = set(self._by_name)
        for encoder in self.encoders:
            check_model_name(encoder.name)
            check_encoder(encoder)
            if encoder.name in names:
                raise ModelLoadError(f"two models are served as '{encoder.name}'; give each its own served_model_name")
            names.add(encoder.name)
        self._read_now()

    @property
    def _known_names(self) -> frozenset[str]:
        return frozenset(self._by_name) | {encoder.name for encoder in self.encoders}

    def _folder(self) -> Path | None:
        defaults = self._folder_defaults
        return Path(defaults.models_dir).expanduser() if defaults is not None and defaults.models_dir else None

    def _read_now(self) -> None:
        """Read models_dir here, blocking: at start, before the server serves."""
        if (folder := self._folder()) is None or self._folder_defaults is None:
            return
        self._readings.begin(folder)
        self._take(read_folder(folder, self._folder_defaults, self._known_names))

    async def rescan(self) -> None:
        """Read models_dir again for a request (a listing, /metrics, an unknown name),
        when a reading is due (folder_reading.ReadingsDue). In a worker
        thread, one reading at a time (a request meanwhile waits for it): a client asking
        in a loop neither has the folder read more often nor holds up the event loop."""
        if (folder := self._folder()) is None or self._folder_defaults is None:
            return
        while self._reading is not None:
            await self._reading.wait()
        if not self._readings.due(folder):
            if self._found_names is not None:
                self._forget_gone(self._found_names)
            return
        reading = self._reading = trio.Event()
        try:
            self._readings.begin(folder)
            found = await trio.to_thread.run_sync(read_folder, folder, self._folder_defaults, self._known_names)
            self._take(found)
        finally:
            self._reading = None
            reading.set()

    def _forget_gone(self, found: frozenset[str]) -> None:
        """Forget the models of models_dir not among `found` that are not loaded."""
        for service in list(self.services):
            if service.on_demand and service.model_name not in found and service.state in ("unloaded", "failed"):
                self.services.remove(service)
                del self._by_name[service.model_name]
                self.residency.failed_loads.forget(service)
                self._forget(service.model_name)
        for encoder in list(self.encoders):
            scope = self._found_encoders.get(encoder.name)
            if scope is not None and encoder.name not in found and encoder.state in ("unloaded", "failed"):
                scope.cancel()
                self.encoders.remove(encoder)
                del self._found_encoders[encoder.name]
                if encoder in self._unstarted:
                    self._unstarted.remove(encoder)
                self._forget(encoder.name)

    def _take(self, found: Reading) -> None:
        """Serve the models of models_dir added since the last reading, and forget those
        whose file is gone and that are not loaded (discovery.py): all the server kept
        of them, their metrics too, so one of the same name found later starts afresh."""
        models = found.models
        self._found_names = frozenset(models)
        self._forget_gone(self._found_names)
        taken = {encoder.name for encoder in self.encoders}
        for name, model in models.items():
            if name in self._by_name or name in taken:
                continue
            if model.kind != "generation":
                if name in found.encoders:
                    self._serve_encoder(model, found.encoders[name])
                continue
            checked = found.generation.get(name)
            if checked is None:  # known when the reading began, forgotten since: the next reading checks it
                continue
            service = ModelService(
                settings_for(model, self._folder_defaults),  # type: ignore[arg-type]
                observer=self._observer_of if self._observer else None,
                on_demand=True,
                loader=self._loader,
            )
            if isinstance(checked, str):  # listed, failed, with the reason
                service.failure = checked
                service.failed.set()
            else:
                service.take_check(*checked)
                self._longest_context = max(self._longest_context, checked[0].context_length)
            self.services.append(service)
            self._by_name[name] = service
        if self._on_rescan is not None:
            self._on_rescan()

    def takes_images(self) -> bool:
        """Whether a model served (known to be) is a vision-language model."""
        return any(service.source is not None and service.source.vision for service in self.services)

    def takes_audio(self) -> bool:
        """Whether a transcription (Whisper) model is served."""
        return any(encoder.kind == "transcription" for encoder in self.encoders)

    def _serve_encoder(self, model: FolderModel, failure: str | None) -> None:
        """Serve the encoder `model` of models_dir, loaded on its first request; a folder
        that cannot serve (`failure` says why) is listed failed, with the reason, and
        tried again on the next request."""
        assert self._folder_defaults is not None
        settings = settings_for(model, self._folder_defaults)
        encoder = build_encoder(model.name, model.kind, settings, model.path, self._encoder_observer)
        if failure is not None:
            encoder.fail(failure)
        self._govern(encoder)
        self.encoders.append(encoder)
        scope = self._found_encoders[encoder.name] = trio.CancelScope()
        if self._nursery is not None:
            self._nursery.start_soon(self._run_encoder, encoder, scope)
        else:
            self._unstarted.append(encoder)

    def _govern(self, encoder: Encoder) -> None:
        """Put `encoder` under the residency's rules: its loads built, reported, and given room (Residency.room_for)."""
        encoder.loader = self._encoder_loader
        encoder.load_observer = self._lifecycle
        encoder.admission = self.residency.room_for

    async def _run_encoder(self, encoder: Encoder, scope: trio.CancelScope) -> None:
        """Run an encoder of models_dir until the server stops or its folder is gone."""
        with scope:
            await encoder.run()

    @property
    def default(self) -> ModelService | None:
        """The first model: for the endpoints where `model` is optional (tokenize);
        None when the server serves only a models_dir, and it is empty."""
        return self.services[0] if self.services else None

    async def find(self, name: str) -> ModelService | None:
        """The model served as `name`, looking in models_dir again if it is unknown."""
        service = self._by_name.get(name)
        if service is None and self._folder_defaults is not None:
            await self.rescan()
            service = self._by_name.get(name)
        return service

    async def take_lease(self, service: ModelService, keep_alive: float | None = None) -> tuple[ServingModel, Lease]:
        """The loaded model of `service` and a lease on it (Residency.take_lease)."""
        return await self.residency.take_lease(service, keep_alive)

    async def find_encoder(self, name: str | None, kind: str) -> Encoder | None:
        """The encoder of `kind` named `name` (None: the first of that kind), looking in
        models_dir again if it is unknown."""
        for looked_again in (False, True):
            if looked_again:
                if name is None or self._folder_defaults is None:
                    return None
                await self.rescan()
            for encoder in self.encoders:
                if encoder.kind == kind and (name is None or encoder.name == name):
                    return encoder
        return None

    def named_encoder(self, name: str) -> Encoder | None:
        """The encoder served as `name`, of whatever kind."""
        return next((encoder for encoder in self.encoders if encoder.name == name), None)

    async def lookup(self, name: str) -> ModelService | Encoder | None:
        """The model served as `name`, of whatever kind, looking in models_dir again if
        it is unknown."""
        return self._by_name.get(name) or self.named_encoder(name) or await self.find(name) or self.named_encoder(name)

    def status(self, service: ModelService) -> ModelStatus:
        state = service.state
        if state == "failed":
            return "failed"
        if self.shutdown.draining.is_set():
            return "draining"
        if state == "loaded":
            return "ready"
        if state in ("unloaded", "unloading"):
            return state  # type: ignore[return-value]
        return "loading"

    def counts_for_readiness(self, service: ModelService) -> bool:
        """Whether the server waits for `service` before it is ready: a model loaded at
        start, in its first load (failed or not)."""
        return service in self._at_start and service.cycles <= 1 and service.state in ("loading", "failed")

    def set_base_url(self, base_url: str) -> None:
        """Where clients reach the server, for each model's "serving" log line."""
        for service in self.services:
            service.base_url = base_url

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Load and serve every model, each in a task of its own; started at once."""
        if not self._checked:
            self.check()
        if not self._preloaded:
            futures = self._loader(
                [(service.source or service.check(), service.settings) for service in self._at_start]
            )
            for service, future in zip(self._at_start, futures):
                service.loading = future
        with self._running:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.residency.run)
                for service in self._at_start:
                    await nursery.start(service.run)
                for encoder in self.encoders:
                    if encoder.name not in self._found_encoders:
                        await nursery.start(encoder.run)
                self._nursery = nursery
                for encoder in self._unstarted:
                    nursery.start_soon(self._run_encoder, encoder, self._found_encoders[encoder.name])
                self._unstarted.clear()
                if self._at_start and self._folder_defaults is None:
                    nursery.start_soon(self._watch_failures)
                task_status.started()

    async def _watch_failures(self) -> None:
        """With no models_dir to serve from, a server whose every model failed at start
        has nothing to serve."""
        for service in self._at_start:
            await service.failed.wait()
        if len(self._at_start) > 1:
            log.error("every model failed to load")
        self.failed.set()

    def _observer_of(self, name: str, context_length: int, speculative: bool) -> RequestObserver:
        # The models share each metric family, and with it its token-count buckets:
        # they go up to the longest context of them all.
        assert self._observer is not None
        return self._observer(name, max(context_length, self._longest_context), speculative)

    async def drain(self, cause: str) -> None:
        """Let the requests in flight on every model finish, up to the drain timeout
        (ovtrio/serving/shutdown.py): the generation models loaded now (a model still
        loading serves none: its waiting requests are refused, Residency.acquire) and
        every encoder. `cause` (what asked for the shutdown) goes in the log."""
        schedulers = [service.serving.scheduler for service in self.services if service.serving is not None]
        encoders = [encoder.for_shutdown() for encoder in self.encoders]
        await self.shutdown.drain([*schedulers, *encoders], cause)

    async def close(self) -> None:
        """Stop every model's scheduler and let its engine go (ModelService.close)."""
        for service in self.services:
            await service.close()
        self._running.cancel()
