"""Loading the model into OpenVINO GenAI's pipeline of its backend (ovtrio/engine/backend.py): the
continuous-batching pipeline, or the stateful LLMPipeline; and warming it up.

Both block for seconds and release the GIL while the engine compiles, so the service
runs them in a worker thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ovtrio.engine.backend import engine_backend, stateful_properties
from ovtrio.engine.errors import client_reason
from ovtrio.gguf.cache import CacheEntryError, ModelCache, cache_folder, engine_versions, entry_key, model_identity
from ovtrio.gguf.engine_file import openable_by_engine
from ovtrio.loading.cache_build import EntryBuildError, build_entry_in_child
from ovtrio.loading.deadline import LoadProgress
from ovtrio.loading.gguf_converted import engine_readable
from ovtrio.loading.speculation import Speculation, pipeline_properties, speculation_for
from ovtrio.loading.tables import LoadTables
from ovtrio.loading.warm_up import warm_up, warm_up_stateful
from ovtrio.model.long_rope import whole_prompt_settings
from ovtrio.model.source import ModelLoadError, ModelSource, check_gguf
from ovtrio.model.vision import VisionModel, is_vision_folder, measure_image_tokens
from ovtrio.settings.server import Settings
from ovtrio.text.plain_text import PlainText
from ovtrio.text.vocabulary import Vocabulary

log = logging.getLogger("ovtrio")

# Tokens per KV cache block: the engine's defaults per device (32 on CPU, 16 elsewhere).
_BLOCK_TOKENS = {"CPU": 32}


def block_tokens(device: str) -> int:
    """Tokens per KV cache block on `device` ("CPU", "GPU.1", ...)."""
    return _BLOCK_TOKENS.get(device.split(".")[0].upper(), 16)


@dataclass
class LoadedModel:
    source: ModelSource
    pipeline: Any  # openvino_genai.ContinuousBatchingPipeline, or LLMPipeline (stateful backend)
    tokenizer: Any  # openvino_genai.Tokenizer
    device: str
    load_seconds: float
    vocabulary: Vocabulary | None = None  # when the model has a byte-level one
    phases: dict[str, float] = field(default_factory=dict)  # seconds per loading phase
    origin: str = ""  # where the engine's models came from: "IR", "cached in ...", "converted ..."
    speculation: Speculation = Speculation()
    vision: VisionModel | None = None  # a vision-language model: what its images cost
    # The IR the engine serves (the scoring path compiles it too); None when a GGUF file
    # was converted in memory only (--no-model-cache, or an unwritable cache).
    model_xml: Path | None = None
    # How message text is kept text (ovtrio/text/plain_text.py).
    plain_text: PlainText = field(default_factory=lambda: PlainText(None))


def engine_properties(settings: Settings) -> dict[str, Any]:
    """OpenVINO properties for the device: the precision hints and thread count that are not
    left to it, and the operator's plugin_config."""
    properties: dict[str, Any] = {}
    if settings.inference_precision != "auto":
        properties["INFERENCE_PRECISION_HINT"] = settings.inference_precision
    if settings.kv_cache_precision != "auto":
        properties["KV_CACHE_PRECISION"] = settings.kv_cache_precision
    if settings.num_threads is not None and settings.device.upper().startswith("CPU"):
        properties["INFERENCE_NUM_THREADS"] = str(settings.num_threads)
    properties.update(settings.plugin_config)
    return properties


def _scheduler_config(settings: Settings) -> Any:
    import openvino_genai

    scheduler_config = openvino_genai.SchedulerConfig()
    scheduler_config.cache_size = settings.cache_size
    if settings.num_kv_blocks is not None:
        scheduler_config.num_kv_blocks = settings.num_kv_blocks
        scheduler_config.cache_size = 0
    scheduler_config.max_num_seqs = settings.max_num_seqs
    scheduler_config.max_num_batched_tokens = settings.max_num_batched_tokens
    scheduler_config.enable_prefix_caching = settings.enable_prefix_caching
    scheduler_config.dynamic_split_fuse = True
    return scheduler_config


def compile_cache_folder(settings: Settings) -> Path:
    """Where the engine keeps the models it compiled, with --compile-cache: OpenVINO's
    CACHE_DIR, in the model cache. Off by default: OpenVINO's CPU plugin (2026.4) writes
    the continuous-batching pipeline's paged-attention model there but cannot import it
    back (the blob lacks the attention nodes' k_head_size and num_k_heads), so on CPU
    every load hashes the model, fails the import, compiles anyway and writes the blob
    again (docs/models.md)."""
    return cache_folder(settings.cache_dir, settings.data_dir) / "compiled"


# Told the IR folder a pipeline is about to be built from (the load reads its tokenizer
# IR meanwhile, on another thread).
FolderHook = Callable[[Path], None] | None


def _build(
    path: Path, settings: Settings, phases: dict[str, float], save: bool = False, on_folder: FolderHook = None
) -> tuple[Any, Any]:
    """Tokenizer and pipeline from a GGUF file or IR folder at `path`; with `save`,
    the engine also writes the IR it converts from a GGUF file next to it."""
    import openvino_genai

    if on_folder is not None and path.is_dir():
        on_folder(path)

    extra = {"enable_save_ov_model": True} if save else {}
    # The continuous-batching pipeline reads the tokenizer itself (from an IR folder or a
    # GGUF file), and its constructor lets go of the GIL; the Tokenizer's constructor
    # holds it throughout (for seconds from a GGUF file: docs/benchmarks.md#loading-a-model),
    # which would pause the event loop of a server that loads a model while it serves
    # others. Only it can save the tokenizer's IR: that is done in a child process
    # (cache_build.py).
    own_tokenizer = save or engine_backend(settings) == "stateful"
    tokenizer = None
    if own_tokenizer:
        started = time.perf_counter()
        tokenizer = openvino_genai.Tokenizer(str(path), **extra)
        phases["tokenizer"] = time.perf_counter() - started
    started = time.perf_counter()
    hints = engine_properties(settings)
    if settings.compile_cache and "CACHE_DIR" not in hints:
        hints["CACHE_DIR"] = str(compile_cache_folder(settings))
        if settings.device.upper().startswith("CPU") and engine_backend(settings) != "stateful":
            log.warning(
                "--compile-cache on CPU makes loads slower, not faster: the CPU plugin cannot import the"
                " paged-attention model it compiled, so it compiles it again each time"
            )
    if engine_backend(settings) == "stateful" and is_vision_folder(path):
        pipeline = openvino_genai.VLMPipeline(str(path), settings.device, **hints, **stateful_properties(settings))
    elif engine_backend(settings) == "stateful":
        pipeline = openvino_genai.LLMPipeline(
            str(path), tokenizer, settings.device, **hints, **stateful_properties(settings), **extra
        )
    elif tokenizer is None:
        # This constructor takes the properties as one mapping, not as keywords.
        pipeline = openvino_genai.ContinuousBatchingPipeline(
            str(path), _scheduler_config(settings), settings.device, {**hints, **pipeline_properties(settings, hints)}
        )
        tokenizer = pipeline.get_tokenizer()
    else:
        pipeline = openvino_genai.ContinuousBatchingPipeline(
            str(path),
            tokenizer,
            _scheduler_config(settings),
            settings.device,
            **hints,
            **pipeline_properties(settings, hints),
            **extra,
        )
    phases["model"] = time.perf_counter() - started
    return tokenizer, pipeline


def _from_prebuilt(
    cache: ModelCache, key: str, settings: Settings, phases: dict[str, float], on_folder: FolderHook = None
) -> tuple[Any, Any, str, Path] | None:
    """Tokenizer and pipeline from the entry of a cache that is only read, or None
    (with a warning line when it has one the engine cannot use: the writable cache
    takes over, and this one is left as it is)."""
    try:
        folder = cache.lookup(key)
    except CacheEntryError as exc:
        log.warning("prebuilt model cache entry %s is unusable (%s)", cache.entry(key), exc)
        return None
    if folder is None:
        return None
    try:
        tokenizer, pipeline = _build(folder, settings, phases, on_folder=on_folder)
    except Exception as exc:  # noqa: BLE001 (the engine raises RuntimeError with a multi-line C++ trace)
        log.warning("prebuilt model cache entry %s is unusable (%s)", folder, client_reason(exc))
        return None
    return tokenizer, pipeline, f"cached in {folder}", folder


def _build_with_cache(
    source: ModelSource, settings: Settings, phases: dict[str, float], on_folder: FolderHook = None
) -> tuple[Any, Any, str, Path | None]:
    """Tokenizer and pipeline for a GGUF file, from the cache entry when there is a
    good one, else converted and kept as a new entry. Also says which happened.

    An entry the engine fails to load is converted again, and the new entry replaces
    it only once the conversion has loaded: a failure that is not the entry's (settings
    the engine refuses, too little memory) fails the conversion too and leaves the
    entry for the next start."""
    cache = ModelCache(cache_folder(settings.cache_dir, settings.data_dir))
    identity = model_identity(source.path)
    key = entry_key(identity, engine_versions())
    if settings.prebuilt_cache_dir:
        prebuilt_cache = ModelCache(Path(settings.prebuilt_cache_dir).expanduser())
        prebuilt = _from_prebuilt(prebuilt_cache, key, settings, phases, on_folder)
        if prebuilt is not None:
            return prebuilt
    try:
        folder = cache.lookup(key)
    except CacheEntryError as exc:
        log.warning("model cache entry %s is unusable (%s); rebuilding it", cache.entry(key), exc)
        cache.discard(key)
        folder = None
    replacing = False
    if folder is not None:
        try:
            tokenizer, pipeline = _build(folder, settings, phases, on_folder=on_folder)
            return tokenizer, pipeline, f"cached in {folder}", folder
        except Exception as exc:  # noqa: BLE001 (the engine raises RuntimeError with a multi-line C++ trace)
            log.warning("model cache entry %s is unusable (%s); rebuilding it", folder, client_reason(exc))
            replacing = True
    try:
        started = time.perf_counter()
        folder = build_entry_in_child(source.path, cache.root, replacing, settings.load_timeout or None)
        phases["IR conversion"] = time.perf_counter() - started
    except (OSError, EntryBuildError) as exc:
        # A full or unwritable cache, or a conversion the engine fails only when it saves
        # what it converts: served uncached (the engine converts in memory at each start).
        # A model the engine cannot read fails here again, with the engine's reason.
        log.warning("cannot keep the converted model in %s (%s); loading it uncached", cache.root, exc)
        with openable_by_engine(source.path) as path:
            tokenizer, pipeline = _build(path, settings, phases)
        return tokenizer, pipeline, "converted, not cached", None
    tokenizer, pipeline = _build(folder, settings, phases, on_folder=on_folder)
    return tokenizer, pipeline, f"converted and cached in {folder}", folder


def build_saving(path: Path, settings: Settings) -> None:
    """Build the pipeline for the GGUF file at `path`, the engine writing the IR it
    converts next to it (for cache_build.py's child, which builds a cache entry)."""
    _build(path, settings, {}, save=True)


def load_model(source: ModelSource, settings: Settings) -> LoadedModel:
    """Build the backend's pipeline. Blocking; releases the GIL while compiling."""
    return _load(source, settings, warm=False, progress=LoadProgress(source.name, None))[0]


def load_and_warm_up(
    source: ModelSource, settings: Settings, progress: LoadProgress | None = None
) -> tuple[LoadedModel, int]:
    """load_model, then warm_up (timed as a phase of the load); the model and its KV
    cache capacity in tokens. `progress` is told each phase as it begins, and that the
    load ended (deadline.py: what watches it fails it past its deadline)."""
    progress = progress or LoadProgress(source.name, None)
    try:
        log.info("loading %s (%s) on %s", source.path, source.kind, settings.device)
        model, kv_capacity = _load(source, settings, warm=True, progress=progress)
        if source.vision:
            progress.enter("image measurement")
            model.vision = _measure_images(model, engine_backend(settings) == "stateful")
    finally:
        progress.end()
    return model, kv_capacity


def _load(source: ModelSource, settings: Settings, warm: bool, progress: LoadProgress) -> tuple[LoadedModel, int]:
    """The engine's pipeline, the tables read from the model's files, and (with `warm`)
    the warm-up. The engine compiles on one core, without the GIL; the Python work of a
    load (the compiled-grammar seam, the vocabulary, the plain-text tokenizer from the
    tokenizer's IR) runs meanwhile on another thread, off the load's critical path. The
    warm-up, which keeps both cores busy, then runs alone (the phases' times:
    docs/benchmarks.md#a-models-load-as-a-requests-latency)."""
    started = time.perf_counter()
    phases: dict[str, float] = {}
    settings = whole_prompt_settings(source, settings)  # a LongRoPE model's engine prefills prompts whole
    progress.enter("chat template")
    template = _chat_template(settings)
    with LoadTables(source.path, source.kind, settings.grammar_cache_bytes) as tables:
        progress.enter("GGUF tensor conversion" if source.convert_tensors else "engine")
        tokenizer, pipeline, origin, ir_folder = _engine(source, settings, phases, tables.on_folder, progress)
        if template is not None:
            tokenizer.set_chat_template(template)
        progress.enter("vocabulary")
        tables_started = time.perf_counter()
        # The tokenizer's IR: an IR folder's own, or the GGUF file's cache entry (which a
        # first conversion writes only as the pipeline is built: read it now).
        read = tables.finish(tokenizer, source.path if source.kind != "gguf" else ir_folder)
        phases["vocabulary"] = time.perf_counter() - tables_started
    model = LoadedModel(
        source=source,
        pipeline=pipeline,
        tokenizer=tokenizer,
        device=settings.device,
        load_seconds=0.0,
        vocabulary=read.vocabulary,
        phases=phases,
        origin=origin,
        speculation=speculation_for(settings, source),
        model_xml=ir_folder / "openvino_model.xml" if ir_folder is not None else None,
        plain_text=read.plain_text,
    )
    if warm:
        progress.enter("warm-up")
    kv_capacity = _warm_up(model, settings) if warm else 0
    model.load_seconds = time.perf_counter() - started
    return model, kv_capacity


def _chat_template(settings: Settings) -> str | None:
    """The --chat-template file's text (read before the engine compiles: a path that
    cannot be read fails the load at once)."""
    if not settings.chat_template:
        return None
    try:
        return Path(settings.chat_template).expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise ModelLoadError(f"cannot read chat template {settings.chat_template}: {exc.strerror}") from None


def _engine(
    source: ModelSource,
    settings: Settings,
    phases: dict[str, float],
    on_folder: FolderHook,
    progress: LoadProgress | None = None,
) -> tuple[Any, Any, str, Path | None]:
    """Tokenizer and pipeline, where the engine's models came from, and the IR folder
    the engine serves (None: a GGUF file converted in memory only, or a vision model)."""
    if source.kind == "gguf":
        # Checked again as it is now, just before the converter or the engine reads it: a
        # file cut short or rewritten since it was first checked would crash the engine.
        check_gguf(source.path)
    try:
        if source.build_graph:
            from ovtrio.loading.gguf_built import built_engine

            return built_engine(source, settings, phases, on_folder, _build)
        if source.kind == "gguf" and settings.model_cache:
            with engine_readable(source, settings, phases) as readable:
                if progress is not None:
                    progress.enter("engine")
                return _build_with_cache(readable, settings, phases, on_folder)
        if source.kind == "gguf":
            with engine_readable(source, settings, phases) as readable, openable_by_engine(readable.path) as path:
                if progress is not None:
                    progress.enter("engine")
                tokenizer, pipeline = _build(path, settings, phases)
            return tokenizer, pipeline, "converted", None
        tokenizer, pipeline = _build(source.path, settings, phases, on_folder=on_folder)
        # A vision-language model's language model takes embeddings: nothing to score with.
        return tokenizer, pipeline, "IR", None if source.vision else source.path
    except ModelLoadError:
        raise
    except Exception as exc:  # noqa: BLE001 (the engine raises RuntimeError with a multi-line C++ trace)
        hints = engine_properties(settings)
        with_hints = f" with {', '.join(f'{k}={v}' for k, v in hints.items())}" if hints else ""
        raise ModelLoadError(
            f"cannot load model {source.path} on {settings.device}{with_hints}: {client_reason(exc)}"
        ) from None


def _warm_up(model: LoadedModel, settings: Settings) -> int:
    started = time.perf_counter()
    try:
        kv_capacity = warm_up_stateful(model) if engine_backend(settings) == "stateful" else warm_up(model)
    except RuntimeError as exc:  # the compiled model cannot run on this device: one line, as a load failure
        raise ModelLoadError(
            f"cannot run model {model.source.path} on {settings.device}: {client_reason(exc)}"
        ) from None
    model.phases["warm-up"] = time.perf_counter() - started
    return kv_capacity


def _measure_images(model: LoadedModel, stateful: bool) -> VisionModel:
    import openvino_genai

    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = 1
    config.apply_chat_template = False
    vision = measure_image_tokens(model.pipeline, model.source.path, config, stateful)
    if vision.fixed:
        log.info("takes images: %d prompt tokens each (%s)", vision.tokens_per_image, vision.model_type)
    else:
        log.info(
            "takes images: %d prompt tokens for a %dx%d image (%s; the count of other sizes may differ, and"
            " requests are admitted by this one)",
            vision.tokens_per_image,
            vision.probe_side,
            vision.probe_side,
            vision.model_type,
        )
    return vision
