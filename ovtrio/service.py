"""The model service: loads the model off the event loop, then runs the scheduler.

Routes open before the model is loaded (readiness answers 503 meanwhile), so loading
happens in a task of the app's nursery; the path is checked up front, so a missing or
unusable model stops startup at once with one line.
"""

from __future__ import annotations

import hashlib
import logging
import time

import trio

from ovtrio import __version__
from ovtrio.api.prompts import PromptBuilder
from ovtrio.config import Settings
from ovtrio.model import LoadedModel, ModelLoadError, ModelSource, load_model, resolve_model
from ovtrio.scheduler import Scheduler

log = logging.getLogger("ovtrio")


def _warm_up(model: LoadedModel) -> None:
    """One tiny generation, so the first client does not pay for the engine's first
    compilation of its kernels (about 300 ms on CPU)."""
    import openvino_genai

    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = 2
    model.pipeline.generate(["Hello"], [config])


class ModelService:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.source: ModelSource | None = None
        self.model: LoadedModel | None = None
        self.scheduler: Scheduler | None = None
        self.prompts: PromptBuilder | None = None
        self.ready = trio.Event()
        self.failed = trio.Event()
        self.failure: str | None = None
        self.started_at = time.time()
        # Where clients reach the server, when the launcher knows it (`ovtrio serve`
        # does; under a bare `hypercorn` the address is in hypercorn's own log line).
        self.base_url: str | None = None

    @property
    def model_name(self) -> str:
        assert self.source is not None
        return self.source.name

    @property
    def context_length(self) -> int:
        assert self.source is not None
        return self.source.context_length

    @property
    def system_fingerprint(self) -> str:
        digest = hashlib.sha256(f"{__version__}|{self.source and self.source.path}|{self.settings.device}".encode())
        return "fp_" + digest.hexdigest()[:10]

    def check(self) -> ModelSource:
        """Resolve and check the model path; raises ModelLoadError (one line) if unusable."""
        self.source = resolve_model(self.settings)
        return self.source

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        source = self.source or self.check()
        task_status.started()
        log.info("loading %s (%s) on %s", source.path, source.kind, self.settings.device)
        try:
            model = await trio.to_thread.run_sync(load_model, source, self.settings)
            await trio.to_thread.run_sync(_warm_up, model)
        except ModelLoadError as exc:
            self.failure = str(exc)
            log.error("%s", exc)
            self.failed.set()
            return
        self.model = model
        self.prompts = PromptBuilder(model.tokenizer)
        self.scheduler = Scheduler(model.pipeline, model.tokenizer, model.vocabulary)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.scheduler.run)
            self.ready.set()
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
