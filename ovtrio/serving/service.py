"""The model service: loads one model off the event loop, then runs its scheduler, until
it is unloaded (ovtrio/serving/residency.py decides when) and maybe loaded again.

Routes open before the model is loaded (readiness answers 503 meanwhile), so loading
happens in a task of the app's nursery, or, under `ovtrio serve`, in a thread started
before the app was even imported, which that task waits for (loading.start_loading);
the path is checked up front, so a missing or unusable model stops startup at once with
one line. Once loaded, everything a request needs is in one ServingModel, whose fields
are never missing. A server serves one or several models, each through a service of its
own (ovtrio/serving/registry.py holds them).
"""

from __future__ import annotations

import gc
import hashlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import trio

from ovtrio import __version__
from ovtrio.images import ImageLimits
from ovtrio.model import LoadedModel, ModelLoadError, ModelSource, load_and_warm_up, resolve_model
from ovtrio.model.backend import Capabilities, capabilities_for, engine_backend
from ovtrio.model.chat_format import thinks, tool_parser_for
from ovtrio.model.engine_errors import client_reason
from ovtrio.model.grammar_check import GrammarLimits
from ovtrio.model.limits import (
    RequestCaps,
    SequenceLimit,
    ServerDefaults,
    prefill_slice_tokens,
    request_caps,
    sequence_limit,
    server_defaults,
    work_limits,
)
from ovtrio.model.loading import block_tokens, engine_properties
from ovtrio.model.prompts import PromptBuilder
from ovtrio.model.speculation import apply_defaults
from ovtrio.model.vision import VisionModel
from ovtrio.parsing import ToolCallParser
from ovtrio.scheduler import AdmissionLimits, GenerationScheduler, RequestObserver, Scheduler, StatefulScheduler
from ovtrio.scheduler.engine_step import choose_step
from ovtrio.scoring import Scorer, ScoringEngine
from ovtrio.serving import memory
from ovtrio.settings.server import Settings

log = logging.getLogger("ovtrio")


@dataclass(frozen=True)
class ServingModel:
    """The loaded model and its running scheduler: what every generation request uses."""

    name: str
    system_fingerprint: str
    scheduler: GenerationScheduler
    prompts: PromptBuilder
    sequence_limit: SequenceLimit
    caps: RequestCaps
    defaults: ServerDefaults
    tool_parser: type[ToolCallParser] | None  # None: the model's tool calls are not read
    reasoning: bool  # replies start with <think> reasoning
    # The scoring path (prompt logprobs, top logprobs); None where the backend has none.
    scorer: Scorer | None
    # What the engine backend can do for a request (the API refuses the rest).
    capabilities: Capabilities = Capabilities()
    # A vision-language model: it takes images, and its prompts go to the engine as text.
    vision: VisionModel | None = None
    image_limits: ImageLimits = ImageLimits()
    # Hears the time each image took to read and decode (the metrics).
    image_prepared: Callable[[float], None] = lambda seconds: None


def system_fingerprint(path: Path | None, device: str) -> str:
    digest = hashlib.sha256(f"{__version__}|{path}|{device}".encode())
    return "fp_" + digest.hexdigest()[:10]


def load_summary(model: LoadedModel) -> str:
    """One line: the load time per phase, and where the engine's models came from."""
    total = sum(model.phases.values())
    phases = ", ".join(
        f"{name} {seconds:.1f} s" + (f" ({model.origin})" if name == "model" and model.origin else "")
        for name, seconds in model.phases.items()
    )
    return f"loaded in {total:.1f} s: {phases}"


def scorer_for(model: LoadedModel, settings: Settings, scheduler: Scheduler) -> Scorer:
    """The scoring path of `model`: its IR compiled with the engine's precision hints
    and plugin properties (so its scores are the engine's arithmetic), on the first
    scoring request."""
    xml = model.model_xml
    if model.vision is not None:
        return Scorer(
            None,
            scheduler.reserve,
            "scoring (prompt log-probabilities, top log-probabilities) is not available for a vision-language"
            " model: its language model reads embeddings, not token ids",
        )
    if xml is None:
        return Scorer(
            None,
            scheduler.reserve,
            "scoring needs the model as OpenVINO IR, and this GGUF file was converted without the model cache"
            " (start the server without --no-model-cache, with a writable --cache-dir)",
        )

    def load() -> ScoringEngine:
        return ScoringEngine(xml, model.device, engine_properties(settings), settings.scoring_chunk_tokens)

    return Scorer(load, scheduler.reserve)


# Makes the observer of a model's requests from its served name, its context length and
# whether the pipeline speculates.
ObserverFactory = Callable[[str, int, bool], RequestObserver]


class ModelService:
    def __init__(
        self,
        settings: Settings,
        observer: ObserverFactory | None = None,
        loading: Future[tuple[LoadedModel, int]] | None = None,
        on_demand: bool = False,
    ) -> None:
        """`observer`, when given, makes what the scheduler reports each request's
        timings and end to (the metrics), once the model is known. `loading`, when
        given, is the load already under way (start_loading) of the model that
        `settings` name; it may also be set later, before `run`. `on_demand`: the
        model waits for its first request to load."""
        self.settings = settings
        self._observer = observer
        self.loading = loading
        # Loaded on the first request that names it (a models_dir's model), not at start.
        self.on_demand = loading is None and on_demand
        self.source: ModelSource | None = None
        self.serving: ServingModel | None = None  # set when ready
        # Each load is a cycle of its own, with fresh events: `ready` once it serves,
        # `failed` (with `failure`) if its load or its scheduler failed.
        self.cycles = 0
        self.ready = trio.Event()
        self.failed = trio.Event()
        self.failure: str | None = None
        self.refusal: str | None = None  # why the last load could not begin (refuse)
        # Seconds the last load took (loaded and warmed up), for the metrics and the list.
        self.load_seconds: float | None = None
        self._running = trio.CancelScope()
        self._stopped = trio.Event()
        self._started = False
        self._in_cycle = False  # a load has begun and its serving has not ended
        self._unloading = False
        # When a request last named the model (trio's clock), and how long it may stay
        # loaded idle after that when a request said so (its keep_alive; None: the
        # server's model_idle_unload).
        self.last_used = 0.0
        self.keep_alive: float | None = None
        self.started_at = time.time()
        # Where clients reach the server, when the launcher knows it (`ovtrio serve`
        # does; under a bare `hypercorn` the address is in hypercorn's own log line).
        self.base_url: str | None = None

    @property
    def model_name(self) -> str:
        if self.source is None:  # a models_dir's model whose file is unusable: named after it
            assert self.settings.served_model_name is not None, "check() runs before serving"
            return self.settings.served_model_name
        return self.source.name

    def check(self) -> ModelSource:
        """Resolve and check the model path; raises ModelLoadError (one line) if unusable."""
        self.source = resolve_model(self.settings)
        return self.source

    @property
    def state(self) -> str:
        """unloaded, loading, loaded, failed or unloading (llama-server's router words,
        and the failure of the last load)."""
        if self._unloading:
            return "unloading"
        if self.failed.is_set():
            return "failed"
        if self.ready.is_set() and self.serving is not None:
            return "loaded"
        if self._in_cycle or (self.cycles == 0 and not self.on_demand):
            return "loading"
        return "unloaded"

    @property
    def in_flight(self) -> int:
        """Requests the loaded model runs or queues (0 when it is not loaded)."""
        serving = self.serving
        return serving.scheduler.in_flight if serving is not None else 0

    def begin_cycle(self) -> None:
        """A new load begins (run follows): fresh events, the model now "loading"."""
        if self.cycles:
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
        failed, self.failed = self.failed, trio.Event()
        failed.set()

    async def settled(self) -> None:
        """Return once the current load has ended: ready or failed."""
        ready, failed = self.ready, self.failed
        if ready.is_set() or failed.is_set():
            return
        async with trio.open_nursery() as nursery:

            async def wait(event: trio.Event) -> None:
                await event.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(wait, ready)
            nursery.start_soon(wait, failed)

    async def close(self) -> None:
        """Stop the scheduler and let the engine go; for the app's lifespan shutdown, once
        no handler can reach the engine. Waits for a step in flight to end first."""
        self._running.cancel()
        if self._started:
            await self._stopped.wait()

    async def unload(self, drain_timeout: float, message: str, code: str) -> int:
        """Take no new requests, let those in flight finish for up to `drain_timeout`
        seconds, end the rest with Failed(`message`, `code`), then stop the scheduler
        and let the engine go; how many requests were ended. A load under way finishes
        first."""
        if not self._in_cycle:
            if self.failed.is_set():  # forget the failed load: the next request tries again
                self.failed = trio.Event()
                self.failure = None
            return 0
        self._unloading = True
        try:
            await self.settled()
            cut = 0
            serving = self.serving
            if serving is not None:
                serving.scheduler.drain()
                with trio.move_on_after(drain_timeout):
                    await serving.scheduler.idle()
                cut = serving.scheduler.fail_all(message, code)
            del serving
            await self.close()
            self.ready = trio.Event()
            if self.failed.is_set():
                self.failed = trio.Event()
                self.failure = None
        finally:
            self._unloading = False
        # What the engine held is freed now; glibc keeps it unless asked to return it.
        gc.collect()
        await memory.return_free_memory()
        return cut

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        source = self.source or self.check()
        if not self._in_cycle:
            self.begin_cycle()
        self._started = True
        task_status.started()
        try:
            with self._running:
                await self._serve(source)
        finally:
            released = self.serving is not None
            self.serving = None  # the last reference outside the handlers: the pipeline goes
            self._in_cycle = False
            self._stopped.set()
            if released:
                log.info("engine released (%s)", source.name)

    async def _run_scheduler(
        self, scheduler: GenerationScheduler, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the scheduler; if its loop fails (nothing a request sends should make it,
        engine_intake.py fails that request alone), the model is marked failed: readiness
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
                loading, self.loading = self.loading, None  # the future would keep the pipeline after an unload
                model, kv_capacity = await trio.to_thread.run_sync(loading.result)
            else:
                model, kv_capacity = await trio.to_thread.run_sync(load_and_warm_up, source, self.settings)
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
        limit = sequence_limit(source, kv_capacity, self.settings)
        if 0 < kv_capacity < source.context_length:
            log.warning(
                "the KV cache holds %d tokens, less than the model's context of %d", kv_capacity, source.context_length
            )
        template = model.tokenizer.chat_template or ""
        work = work_limits(self.settings, kv_capacity)
        caps = request_caps(self.settings, source, kv_capacity, work)
        limits = AdmissionLimits(
            max_running_sequences=work.running_sequences,
            max_queued_requests=work.queued_requests,
            slow_reader_buffer=self.settings.slow_reader_buffer,
            slow_reader_timeout=self.settings.slow_reader_timeout,
        )
        if stateful:
            log.info(
                "stateful backend: one request at a time, %d waiting at most; prompts of at most %d tokens,"
                " %d tokens with the reply",
                work.queued_requests,
                capabilities_for(self.settings).max_prompt_tokens or limit.tokens,
                limit.tokens,
            )
        else:
            log.info(
                "admission: %d sequences running and %d requests waiting at most (KV cache %d tokens);"
                " per request at most %d prompts, %d choices, %d prompt tokens",
                work.running_sequences,
                work.queued_requests,
                kv_capacity,
                caps.prompts,
                caps.choices,
                caps.prompt_tokens,
            )
        observer = (
            self._observer(source.name, source.context_length, model.speculation.enabled) if self._observer else None
        )
        scheduler: GenerationScheduler
        if step is None:
            scheduler = StatefulScheduler(
                model.pipeline, model.tokenizer, model.vocabulary, self.settings.stream_interval, limits, observer
            )
        else:
            slice_tokens = prefill_slice_tokens(self.settings, model.device)
            if slice_tokens:
                log.info("prompts longer than %d tokens are prefilled in slices of at most that size", slice_tokens)
            scheduler = Scheduler(
                model.pipeline,
                model.tokenizer,
                model.vocabulary,
                stream_interval=self.settings.stream_interval,
                step=step,
                limits=limits,
                observer=observer,
                prefill_slice_tokens=slice_tokens,
                step_tokens=self.settings.max_num_batched_tokens,
                kv_block_tokens=block_tokens(model.device),
                grammar_limits=GrammarLimits(seconds=self.settings.grammar_compile_seconds),
            )
        self.serving = ServingModel(
            name=source.name,
            system_fingerprint=system_fingerprint(source.path, self.settings.device),
            scheduler=scheduler,
            prompts=PromptBuilder(
                model.tokenizer,
                source.vocab_size,
                model.vocabulary,
                cut_at=source.context_length,
                plain_text=model.plain_text,
                parse_special_in_content=self.settings.parse_special_in_content,
            ),
            sequence_limit=limit,
            caps=caps,
            defaults=server_defaults(source, self.settings),
            tool_parser=tool_parser_for(self.settings, template),
            reasoning=thinks(self.settings, template),
            scorer=None if isinstance(scheduler, StatefulScheduler) else scorer_for(model, self.settings, scheduler),
            capabilities=capabilities_for(self.settings, vision=source.vision),
            vision=model.vision,
            image_limits=ImageLimits(
                max_images=self.settings.max_images_per_request,
                max_bytes=self.settings.max_image_bytes,
                max_side=self.settings.max_image_side,
                max_pixels=self.settings.max_image_pixels,
                decodes=self.settings.image_decodes,
                fetch_urls=self.settings.image_urls,
                fetch_timeout=self.settings.image_fetch_timeout,
                fetch_private=self.settings.image_fetch_private_addresses,
                model_short_side=model.vision.short_side if model.vision else None,
                model_max_pixels=model.vision.max_pixels if model.vision else None,
            ),
            image_prepared=getattr(observer, "image_prepared", lambda seconds: None),
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(self._run_scheduler, scheduler)
            if not self.on_demand and self.cycles == 1:
                # What exists now (modules, the model's objects) lives as long as the
                # server: out of the collector's sight, a full collection no longer walks
                # it and pauses the event loop for that long. Not so for a model loaded
                # on demand, which may be unloaded (and what was frozen is never
                # collected).
                gc.freeze()
            # Loading and warming up freed much that glibc would otherwise keep.
            await memory.return_free_memory()
            self.ready.set()
            where = f" at {self.base_url}/v1 and {self.base_url}/v3" if self.base_url else ""
            log.info(
                "serving %s as '%s' on %s (loaded in %.1f s, context %d tokens)%s",
                source.path.name,
                source.name,
                model.device,
                model.load_seconds + model.phases["warm-up"],
                source.context_length,
                where,
            )
