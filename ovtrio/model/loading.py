"""Loading the model into OpenVINO GenAI's continuous-batching pipeline, and warming it up.

Both block for seconds and release the GIL while the engine compiles, so the service
runs them in a worker thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ovtrio.config import Settings
from ovtrio.model.source import ModelLoadError, ModelSource
from ovtrio.model.speculation import Speculation, apply_defaults, pipeline_properties, speculation_for
from ovtrio.model.vocabulary import Vocabulary, load_vocabulary

# Tokens per KV cache block: the engine's defaults per device (32 on CPU, 16 elsewhere).
_BLOCK_TOKENS = {"CPU": 32}


@dataclass
class LoadedModel:
    source: ModelSource
    pipeline: Any  # openvino_genai.ContinuousBatchingPipeline
    tokenizer: Any  # openvino_genai.Tokenizer
    device: str
    load_seconds: float
    vocabulary: Vocabulary | None = None  # when the model has a byte-level one
    speculation: Speculation = Speculation()


def engine_error_reason(exc: Exception) -> str:
    """The line of an engine exception that says what went wrong.

    The engine's messages nest "Exception from src/...cpp:N:" lines (one per layer)
    around the reason, sometimes behind a "Check '...' failed at ...:" line.
    """
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    reasons = [line for line in lines if not line.startswith("Exception from ")]
    if not reasons:
        return type(exc).__name__
    last = reasons[-1]
    return last if not last.startswith("Check '") or len(reasons) == 1 else f"{last} ({reasons[-2]})"


def engine_properties(settings: Settings) -> dict[str, str]:
    """OpenVINO properties for the device: the precision hints that are not left to it."""
    properties = {}
    if settings.inference_precision != "auto":
        properties["INFERENCE_PRECISION_HINT"] = settings.inference_precision
    if settings.kv_cache_precision != "auto":
        properties["KV_CACHE_PRECISION"] = settings.kv_cache_precision
    return properties


def load_model(source: ModelSource, settings: Settings) -> LoadedModel:
    """Build the continuous-batching pipeline. Blocking; releases the GIL while compiling."""
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

    started = time.perf_counter()
    properties: dict[str, object] = {**engine_properties(settings), **pipeline_properties(settings, engine_properties(settings))}
    try:
        pipeline = openvino_genai.ContinuousBatchingPipeline(str(source.path), scheduler_config, settings.device, properties)
    except Exception as exc:  # the engine raises RuntimeError with a multi-line C++ trace
        hints = engine_properties(settings)
        with_hints = f" with {', '.join(f'{k}={v}' for k, v in hints.items())}" if hints else ""
        raise ModelLoadError(
            f"cannot load model {source.path} on {settings.device}{with_hints}: {engine_error_reason(exc)}"
        ) from None
    tokenizer = pipeline.get_tokenizer()
    if settings.chat_template:
        try:
            template = Path(settings.chat_template).expanduser().read_text(encoding="utf-8")
        except OSError as exc:
            raise ModelLoadError(f"cannot read chat template {settings.chat_template}: {exc.strerror}") from None
        tokenizer.set_chat_template(template)
    return LoadedModel(
        source=source,
        pipeline=pipeline,
        tokenizer=tokenizer,
        device=settings.device,
        load_seconds=time.perf_counter() - started,
        vocabulary=load_vocabulary(source.path, source.kind, tokenizer),
        speculation=speculation_for(settings, source),
    )


def warm_up(model: LoadedModel) -> int:
    """Run one tiny request and return the KV cache capacity in tokens.

    The first request pays for the engine's first compilation of its kernels (about
    300 ms on CPU), so a warm-up spares the first client that. While it holds exactly
    one cache block, the engine's cache usage (a percentage) also tells how many blocks
    the cache has, which the engine does not report otherwise.
    """
    import numpy as np
    import openvino as ov
    import openvino_genai

    config = apply_defaults(openvino_genai.GenerationConfig(), model.speculation)
    config.max_new_tokens = 2
    handle = model.pipeline.add_request(0, ov.Tensor(np.asarray([[0] * 4], dtype=np.int64)), config)
    model.pipeline.step()
    usage = model.pipeline.get_metrics().cache_usage
    while model.pipeline.has_non_finished_requests():
        model.pipeline.step()
    del handle
    blocks = round(100.0 / usage) if usage > 0 else 0
    return blocks * _BLOCK_TOKENS.get(model.device.split(".")[0].upper(), 16)
