"""The engine's pipeline of a GGUF file whose model ovtrio builds: from its IR folder."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ovtrio.gguf.builder.cached import built_folder
from ovtrio.gguf.builder.child import BuildError
from ovtrio.gguf.cache import cache_folder
from ovtrio.model.source import ModelLoadError, ModelSource
from ovtrio.settings.server import Settings

# loading._build: tokenizer and pipeline of an IR folder.
BuildPipeline = Callable[..., tuple[Any, Any]]


def built_engine(
    source: ModelSource,
    settings: Settings,
    phases: dict[str, float],
    on_folder: Callable[[Path], None] | None,
    build: BuildPipeline,
) -> tuple[Any, Any, str, Path | None]:
    """Tokenizer and pipeline of `source` (a GGUF file of an architecture ovtrio/gguf/builder/ makes),
    where they came from, and the IR folder served (None: built into a temporary folder,
    gone once the pipeline is built). Raises ModelLoadError when the file cannot be built."""
    started = time.perf_counter()
    cache_root = cache_folder(settings.cache_dir, settings.data_dir) if settings.model_cache else None
    try:
        with built_folder(source.path, cache_root) as (folder, origin):
            phases["build"] = time.perf_counter() - started
            cached = cache_root is not None and "not cached" not in origin
            tokenizer, pipeline = build(folder, settings, phases, on_folder=on_folder if cached else None)
    except BuildError as exc:
        raise ModelLoadError(f"cannot build model {source.path}: {exc}") from None
    return tokenizer, pipeline, origin, folder if cached else None
