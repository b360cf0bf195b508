"""The model service: loads the model off the event loop, then runs the scheduler.

Routes open before the model is loaded (readiness answers 503 meanwhile), so loading
happens in a task of the app's nursery; the path is checked up front, so a missing or
unusable model stops startup at once with one line.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any

import trio

from ovtrio import __version__
from ovtrio.api.prompts import PromptBuilder
from ovtrio.api.sampling import SequenceLimit, ServerDefaults
from ovtrio.config import Settings
from ovtrio.model import LoadedModel, ModelLoadError, ModelSource, load_model, resolve_model
from ovtrio.response_store import ResponseStore
from ovtrio.scheduler import Scheduler
from ovtrio.scheduler.engine_step import choose_step
from ovtrio.tool_parsers import PARSERS, ToolCallParser, guess_parser

log = logging.getLogger("ovtrio")


# Tokens per KV cache block: the engine's defaults per device (32 on CPU, 16 elsewhere).
_BLOCK_TOKENS = {"CPU": 32}


def _warm_up(model: LoadedModel) -> int:
    """Run one tiny request and return the KV cache capacity in tokens.

    The first request pays for the engine's first compilation of its kernels (about
    300 ms on CPU), so a warm-up spares the first client that. While it holds exactly
    one cache block, the engine's cache usage (a percentage) also tells how many blocks
    the cache has, which the engine does not report otherwise.
    """
    import numpy as np
    import openvino as ov
    import openvino_genai

    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = 2
    handle = model.pipeline.add_request(0, ov.Tensor(np.asarray([[0] * 4], dtype=np.int64)), config)
    model.pipeline.step()
    usage = model.pipeline.get_metrics().cache_usage
    while model.pipeline.has_non_finished_requests():
        model.pipeline.step()
    del handle
    blocks = round(100.0 / usage) if usage > 0 else 0
    return blocks * _BLOCK_TOKENS.get(model.device.split(".")[0].upper(), 16)


def _tool_parser(settings: Settings, tokenizer: Any) -> type[ToolCallParser] | None:
    """The configured tool-call parser, or the one the chat template's markers suggest.

    A template with no tool support at all gets OpenVINO GenAI's polyfill, which teaches
    the model to reply with a {"tool_calls": [...]} object: that is then the format.
    """
    name = settings.tool_parser
    if name is None:
        template = tokenizer.chat_template or ""
        name = guess_parser(template) or (None if "tools" in template else "json_tool_calls")
        if name:
            log.info("tool calls are read in the %s format (from the chat template)", name)
    if name in (None, "none"):
        return None
    return PARSERS[name]


class ModelService:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.source: ModelSource | None = None
        self.model: LoadedModel | None = None
        self.scheduler: Scheduler | None = None
        self.prompts: PromptBuilder | None = None
        self.sequence_limit = SequenceLimit(0, "")
        self.defaults = ServerDefaults()
        self.tool_parser: type[ToolCallParser] | None = None
        self.reasoning = False
        self.ready = trio.Event()
        self.failed = trio.Event()
        self.failure: str | None = None
        self.started_at = time.time()
        self.responses = ResponseStore(
            settings.response_store_size, settings.response_store_ttl, settings.response_store_path
        )
        # Where clients reach the server, when the launcher knows it (`ovtrio serve`
        # does; under a bare `hypercorn` the address is in hypercorn's own log line).
        self.base_url: str | None = None

    @property
    def model_name(self) -> str:
        assert self.source is not None
        return self.source.name

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
            kv_capacity = await trio.to_thread.run_sync(_warm_up, model)
            step = await trio.to_thread.run_sync(choose_step, model.pipeline, self.settings.gil_free_step)
        except ModelLoadError as exc:
            self.failure = str(exc)
            log.error("%s", exc)
            self.failed.set()
            return
        self.model = model
        if 0 < kv_capacity < source.context_length:
            self.sequence_limit = SequenceLimit(kv_capacity, "This server's KV cache size")
            log.warning("the KV cache holds %d tokens, less than the model's context of %d", kv_capacity, source.context_length)
        else:
            self.sequence_limit = SequenceLimit(source.context_length, "This model's maximum context length")
        self.prompts = PromptBuilder(model.tokenizer, source.vocab_size, model.vocabulary)
        self.tool_parser = _tool_parser(self.settings, model.tokenizer)
        self.reasoning = self.settings.reasoning_parser == "think" or (
            self.settings.reasoning_parser is None and "<think>" in (model.tokenizer.chat_template or "")
        )
        self.defaults = ServerDefaults(
            {k: source.generation_defaults.get(k) for k in ("temperature", "top_p", "top_k", "repetition_penalty")},
            self.settings.max_tokens_limit,
        )
        self.scheduler = Scheduler(
            model.pipeline, model.tokenizer, model.vocabulary, stream_interval=self.settings.stream_interval, step=step
        )
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
