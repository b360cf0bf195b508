"""`ovtrio convert`: a GGUF model converted into the model cache without serving it."""

from __future__ import annotations

from ovtrio.engine.errors import client_reason
from ovtrio.loading.gguf_converted import engine_readable
from ovtrio.loading.load import _build_with_cache
from ovtrio.model.source import ModelLoadError, ModelSource
from ovtrio.settings.server import Settings


def convert_into_cache(source: ModelSource, settings: Settings) -> str:
    """Convert a GGUF model into the model cache, unless it is there already, without
    serving it; say where its entry is. The engine runs it on the CPU with a KV cache of
    one block (the entry is the same for every device and setting). Raises
    ModelLoadError, also when the cache cannot keep the entry."""
    if source.kind != "gguf":
        return f"{source.path} is an OpenVINO IR folder, served as it is"
    if not settings.model_cache:
        raise ModelLoadError("the model cache is off (--no-model-cache): there is nothing to convert into")
    quick = settings.model_copy(
        update={
            "device": "CPU",
            "backend": "continuous_batching",
            "num_kv_blocks": 1,
            "draft_model": None,
            "prompt_lookup": False,
            "plugin_config": {},
            "inference_precision": "auto",
            "kv_cache_precision": "auto",
            "num_threads": None,
        }
    )
    try:
        with engine_readable(source, quick, {}) as readable:
            _tokenizer, _pipeline, origin, _folder = _build_with_cache(readable, quick, {})
    except ModelLoadError:
        raise
    except Exception as exc:  # noqa: BLE001 (the engine raises RuntimeError with a multi-line C++ trace)
        raise ModelLoadError(f"cannot convert model {source.path}: {client_reason(exc)}") from None
    if "not cached" in origin:
        raise ModelLoadError(f"cannot keep the converted model {source.path} in the model cache (see the warning)")
    return origin
