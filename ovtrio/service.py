"""The model service: loads the model off the event loop, then runs the scheduler.

Routes open before the model is loaded (readiness answers 503 meanwhile), so loading
happens in a task of the app's nursery, or, under `ovtrio serve`, in a thread started
before the app was even imported, which that task waits for (loading.start_loading);
the path is checked up front, so a missing or unusable model stops startup at once with
one line. Once loaded, everything a request needs is in one ServingModel, whose fields
are never missing.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import trio

from ovtrio import __version__
from ovtrio.config import Settings
from ovtrio.model import LoadedModel, ModelLoadError, ModelSource, load_and_warm_up, resolve_model
from ovtrio.model.chat_format import thinks, tool_parser_for
from ovtrio.model.limits import SequenceLimit, ServerDefaults, sequence_limit, server_defaults
from ovtrio.model.prompts import PromptBuilder
from ovtrio.parsing import ToolCallParser
from ovtrio.scheduler import RequestObserver, Scheduler
from ovtrio.scheduler.engine_step import choose_step

log = logging.getLogger("ovtrio")


@dataclass(frozen=True)
class ServingModel:
    """The loaded model and its running scheduler: what every generation request uses."""

    name: str
    system_fingerprint: str
    scheduler: Scheduler
    prompts: PromptBuilder
    sequence_limit: SequenceLimit
    defaults: ServerDefaults
    tool_parser: type[ToolCallParser] | None  # None: the model's tool calls are not read
    reasoning: bool  # replies start with <think> reasoning
    # The engine reuses cached prompt blocks, and then cannot score those prompt tokens.
    prefix_caching: bool


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


# Makes the observer of a model's requests from its served name and context length.
ObserverFactory = Callable[[str, int], RequestObserver]


class ModelService:
    def __init__(
        self,
        settings: Settings,
        observer: ObserverFactory | None = None,
        loading: Future[tuple[LoadedModel, int]] | None = None,
    ) -> None:
        """`observer`, when given, makes what the scheduler reports each request's
        timings and end to (the metrics), once the model is known. `loading`, when
        given, is the load already under way (start_loading) of the model that
        `settings` name."""
        self.settings = settings
        self._observer = observer
        self._loading = loading
        self.source: ModelSource | None = None
        self.serving: ServingModel | None = None  # set when ready
        self.ready = trio.Event()
        self.failed = trio.Event()
        self.failure: str | None = None
        self.started_at = time.time()
        # Where clients reach the server, when the launcher knows it (`ovtrio serve`
        # does; under a bare `hypercorn` the address is in hypercorn's own log line).
        self.base_url: str | None = None

    @property
    def model_name(self) -> str:
        assert self.source is not None, "check() runs before serving"
        return self.source.name

    def check(self) -> ModelSource:
        """Resolve and check the model path; raises ModelLoadError (one line) if unusable."""
        self.source = resolve_model(self.settings)
        return self.source

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        source = self.source or self.check()
        task_status.started()
        try:
            if self._loading is not None:
                model, kv_capacity = await trio.to_thread.run_sync(self._loading.result)
            else:
                model, kv_capacity = await trio.to_thread.run_sync(load_and_warm_up, source, self.settings)
            step = await trio.to_thread.run_sync(choose_step, model.pipeline, self.settings.gil_free_step)
        except ModelLoadError as exc:
            self.failure = str(exc)
            log.error("%s", exc)
            self.failed.set()
            return
        log.info("%s", load_summary(model))
        limit = sequence_limit(source, kv_capacity)
        if limit.tokens < source.context_length:
            log.warning("the KV cache holds %d tokens, less than the model's context of %d", kv_capacity, source.context_length)
        template = model.tokenizer.chat_template or ""
        scheduler = Scheduler(
            model.pipeline,
            model.tokenizer,
            model.vocabulary,
            stream_interval=self.settings.stream_interval,
            step=step,
            observer=self._observer(source.name, source.context_length) if self._observer else None,
        )
        self.serving = ServingModel(
            name=source.name,
            system_fingerprint=system_fingerprint(source.path, self.settings.device),
            scheduler=scheduler,
            prompts=PromptBuilder(model.tokenizer, source.vocab_size, model.vocabulary, cut_at=source.context_length),
            sequence_limit=limit,
            defaults=server_defaults(source, self.settings),
            tool_parser=tool_parser_for(self.settings, template),
            reasoning=thinks(self.settings, template),
            prefix_caching=self.settings.enable_prefix_caching,
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(scheduler.run)
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
