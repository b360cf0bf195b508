"""A loaded model as requests see it (ServingModel): its scheduler, prompt builder,
limits and formats, built once the engine is loaded (serving_model). The service
(ovtrio/serving/service.py) loads the engine and runs the scheduler."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ovtrio import __version__
from ovtrio.constraints.check import GrammarLimits
from ovtrio.engine.backend import Capabilities, capabilities_for
from ovtrio.images import ImageLimits
from ovtrio.loading import LoadedModel
from ovtrio.loading.limits import (
    RequestCaps,
    SequenceLimit,
    ServerDefaults,
    prefill_itl_bound,
    prefill_slice_tokens,
    request_caps,
    sequence_limit,
    server_defaults,
    work_limits,
)
from ovtrio.loading.load import block_tokens, engine_properties
from ovtrio.model import ModelSource
from ovtrio.model.long_rope import whole_prompt_settings
from ovtrio.model.vision import VisionModel
from ovtrio.parsing import ToolCallParser
from ovtrio.scheduler import AdmissionLimits, GenerationScheduler, RequestObserver, Scheduler, StatefulScheduler
from ovtrio.scheduler.engine_step import EngineStep
from ovtrio.scoring import Scorer, ScoringEngine
from ovtrio.settings.server import Settings
from ovtrio.text.chat_format import NO_FORMAT, ChatFormat, chat_format
from ovtrio.text.prompts import PromptBuilder

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
    # The formats of tool calls and reasoning, and why (/v1/models shows them).
    chat_format: ChatFormat = NO_FORMAT


def system_fingerprint(path: Path | None, device: str) -> str:
    digest = hashlib.sha256(f"{__version__}|{path}|{device}".encode())
    return "fp_" + digest.hexdigest()[:10]


def load_summary(model: LoadedModel) -> str:
    """One line: the load's time, its phases, and where the engine's models came from.
    The vocabulary phase is what remained of its reading once the engine had compiled
    (the rest ran meanwhile, ovtrio/loading/load.py)."""
    phases = ", ".join(
        f"{name} {seconds:.1f} s" + (f" ({model.origin})" if name == "model" and model.origin else "")
        for name, seconds in model.phases.items()
    )
    return f"loaded in {model.load_seconds:.1f} s: {phases}"


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


def serving_model(
    source: ModelSource,
    settings: Settings,
    model: LoadedModel,
    kv_capacity: int,
    step: EngineStep | None,
    observer: RequestObserver | None,
) -> ServingModel:
    """Everything requests use of a loaded model: its limits, its scheduler (on `step`,
    or the stateful one when None) and its prompt builder; logs what it admits."""
    settings = whole_prompt_settings(source, settings)  # as the model was loaded with
    limit = sequence_limit(source, kv_capacity, settings)
    if 0 < kv_capacity < source.context_length:
        log.warning(
            "the KV cache holds %d tokens, less than the model's context of %d", kv_capacity, source.context_length
        )
    template = model.tokenizer.chat_template or ""
    formats = chat_format(settings, template)
    work = work_limits(settings, kv_capacity)
    caps = request_caps(settings, source, kv_capacity, work)
    limits = AdmissionLimits(
        max_running_sequences=work.running_sequences,
        max_queued_requests=work.queued_requests,
        slow_reader_buffer=settings.slow_reader_buffer,
        slow_reader_timeout=settings.slow_reader_timeout,
    )
    if step is None:
        log.info(
            "stateful backend: one request at a time, %d waiting at most; prompts of at most %d tokens,"
            " %d tokens with the reply",
            work.queued_requests,
            capabilities_for(settings).max_prompt_tokens or limit.tokens,
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
    prompts = PromptBuilder(
        model.tokenizer,
        source.vocab_size,
        model.vocabulary,
        cut_at=source.context_length,
        plain_text=model.plain_text,
        parse_special_in_content=settings.parse_special_in_content,
    )
    scheduler: GenerationScheduler
    if step is None:
        scheduler = StatefulScheduler(
            model.pipeline,
            model.tokenizer,
            model.vocabulary,
            settings.stream_interval,
            limits,
            observer,
            vocabulary_size=prompts.tokenizer_vocab_size,
        )
    else:
        slice_tokens = prefill_slice_tokens(settings, model.device)
        itl_bound = prefill_itl_bound(settings)
        if slice_tokens and itl_bound is not None:
            log.info(
                "prompts longer than %d tokens are prefilled in slices of up to %d tokens, within %.0f ms a step"
                " beside decoding streams",
                slice_tokens,
                settings.max_num_batched_tokens,
                itl_bound * 1e3,
            )
        elif slice_tokens:
            log.info("prompts longer than %d tokens are prefilled in slices of at most that size", slice_tokens)
        if source.short_rope_context is not None:
            log.info(
                "LongRoPE: prompts longer than %d tokens are prefilled in one step (engine step budget %d tokens,"
                " prefix cache off)",
                source.short_rope_context,
                settings.max_num_batched_tokens,
            )
        scheduler = Scheduler(
            model.pipeline,
            model.tokenizer,
            model.vocabulary,
            stream_interval=settings.stream_interval,
            step=step,
            limits=limits,
            observer=observer,
            prefill_slice_tokens=slice_tokens,
            step_tokens=settings.max_num_batched_tokens,
            kv_block_tokens=block_tokens(model.device),
            grammar_limits=GrammarLimits(seconds=settings.grammar_compile_seconds),
            vocabulary_size=prompts.tokenizer_vocab_size,
            prefill_whole_above=source.short_rope_context or 0,
            max_itl_seconds=itl_bound if slice_tokens else None,
        )
    return ServingModel(
        name=source.name,
        system_fingerprint=system_fingerprint(source.path, settings.device),
        scheduler=scheduler,
        prompts=prompts,
        sequence_limit=limit,
        caps=caps,
        defaults=server_defaults(source, settings),
        tool_parser=formats.tool_parser,
        reasoning=formats.reasoning == "think",
        chat_format=formats,
        scorer=None if isinstance(scheduler, StatefulScheduler) else scorer_for(model, settings, scheduler),
        capabilities=capabilities_for(settings, vision=source.vision),
        vision=model.vision,
        image_limits=ImageLimits(
            max_images=settings.max_images_per_request,
            max_bytes=settings.max_image_bytes,
            max_side=settings.max_image_side,
            max_pixels=settings.max_image_pixels,
            decodes=settings.image_decodes,
            fetch_urls=settings.image_urls,
            fetch_timeout=settings.image_fetch_timeout,
            fetch_private=settings.image_fetch_private_addresses,
            model_short_side=model.vision.short_side if model.vision else None,
            model_max_pixels=model.vision.max_pixels if model.vision else None,
        ),
        image_prepared=getattr(observer, "image_prepared", lambda seconds: None),
    )
