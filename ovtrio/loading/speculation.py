"""Speculative decoding: how the pipeline is built for it, and the defaults requests get.

OpenVINO GenAI's continuous-batching pipeline speculates in one of two ways, chosen
when it is built, and then for every request it holds:

- prompt lookup (`prompt_lookup=True` in its properties): candidates are the tokens
  that followed the latest n-gram's earlier occurrence in the prompt and output so far.
  Every request needs `num_assistant_tokens` and `max_ngram_size` (the engine refuses a
  request without them), so the server fills in defaults for a request that leaves them
  out, as OVMS does: num_assistant_tokens 5, max_ngram_size 3.
- a draft model (`draft_model=openvino_genai.draft_model(...)` in its properties): the
  draft proposes tokens, the main model verifies them in one pass. Every request needs
  `num_assistant_tokens` or `assistant_confidence_threshold` (exactly one); the default
  for a request with neither is the main model's generation_config.json, then
  num_assistant_tokens 5 (OVMS's order).

The main model checks every candidate, so greedy output is the main model's own, up to
the arithmetic: a verification pass of several positions quantizes activations (the CPU
plugin's dynamic quantization for compressed weights) and rounds in other groups than a
one-token decoding pass, which can turn a near tie into another token. With f32 compute,
an f32 KV cache and `plugin_config` {"DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}, greedy tokens
matched plain decoding exactly on the embedded model (7 prompts of 128 tokens, both ways
of speculating), and tests/test_speculative.py checks it through the server.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ovtrio.gguf.cache import cache_folder
from ovtrio.gguf.engine_file import place_for_engine
from ovtrio.gguf.targets import Preference
from ovtrio.model.source import ModelLoadError, ModelSource
from ovtrio.settings.server import Settings

log = logging.getLogger("ovtrio")

# OVMS's defaults (src/llm/io_processing/base_generation_config_builder.cpp).
DEFAULT_NUM_ASSISTANT_TOKENS = 5
DEFAULT_MAX_NGRAM_SIZE = 3

Mode = Literal["none", "prompt_lookup", "draft_model"]


@dataclass(frozen=True)
class Speculation:
    """How the served pipeline speculates, and the per-request values used when a
    request leaves them out (0 / 0.0: not set)."""

    mode: Mode = "none"
    num_assistant_tokens: int = 0
    assistant_confidence_threshold: float = 0.0
    max_ngram_size: int = 0

    @property
    def enabled(self) -> bool:
        return self.mode != "none"


def speculation_for(settings: Settings, source: ModelSource) -> Speculation:
    """The server's speculation and its request defaults (from the model's
    generation_config.json where it sets them)."""
    model = source.generation_defaults
    if settings.prompt_lookup:
        return Speculation(
            "prompt_lookup",
            num_assistant_tokens=_positive_int(model.get("num_assistant_tokens")) or DEFAULT_NUM_ASSISTANT_TOKENS,
            max_ngram_size=_positive_int(model.get("max_ngram_size")) or DEFAULT_MAX_NGRAM_SIZE,
        )
    if settings.draft_model:
        tokens = _positive_int(model.get("num_assistant_tokens"))
        threshold = model.get("assistant_confidence_threshold")
        if not tokens and isinstance(threshold, (int, float)) and 0 < threshold <= 1:
            return Speculation("draft_model", assistant_confidence_threshold=float(threshold))
        return Speculation("draft_model", num_assistant_tokens=tokens or DEFAULT_NUM_ASSISTANT_TOKENS)
    return Speculation()


def _positive_int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def apply_defaults(config: Any, speculation: Speculation) -> Any:
    """Give an engine GenerationConfig the server's speculation defaults (the warm-up's
    and the step check's requests must satisfy the pipeline too)."""
    config.num_assistant_tokens = speculation.num_assistant_tokens
    config.assistant_confidence_threshold = speculation.assistant_confidence_threshold
    config.max_ngram_size = speculation.max_ngram_size
    return config


def pipeline_properties(settings: Settings, device_properties: dict[str, str]) -> dict[str, Any]:
    """The pipeline properties that turn speculation on. Blocking when the draft model
    is a GGUF file that has not been converted yet (see draft_folder)."""
    if settings.prompt_lookup and settings.draft_model:
        raise ModelLoadError("--prompt-lookup and --draft-model cannot be used together: choose one way to speculate")
    if settings.prompt_lookup:
        return {"prompt_lookup": True}
    if not settings.draft_model:
        return {}
    import openvino_genai

    cache = cache_folder(settings.cache_dir, settings.data_dir)
    folder = draft_folder(Path(settings.draft_model).expanduser(), cache, settings.gguf_conversion)
    kwargs: dict[str, Any] = dict(device_properties)
    if settings.draft_cache_size is not None:
        # Without a scheduler config of its own, the engine splits the main KV cache
        # between the two models by their hidden sizes.
        scheduler = openvino_genai.SchedulerConfig()
        scheduler.cache_size = settings.draft_cache_size
        scheduler.max_num_seqs = settings.max_num_seqs
        scheduler.max_num_batched_tokens = settings.max_num_batched_tokens
        scheduler.enable_prefix_caching = settings.enable_prefix_caching
        scheduler.dynamic_split_fuse = True
        kwargs["scheduler_config"] = scheduler
    try:
        draft = openvino_genai.draft_model(str(folder), settings.draft_device or settings.device, **kwargs)
    except Exception as exc:  # noqa: BLE001 (RuntimeError with the engine's multi-line trace)
        raise ModelLoadError(f"cannot load draft model {settings.draft_model}: {_last_line(exc)}") from None
    return {"draft_model": draft}


def draft_folder(path: Path, cache: Path, preference: Preference = "exact") -> Path:
    """An OpenVINO IR folder for the draft model at `path`.

    `openvino_genai.draft_model()` reads only IR folders (openvino_model.xml and the
    tokenizer's IR). A GGUF file is converted once by the engine's own GGUF reader
    (`enable_save_ov_model`, which writes next to the file it reads, so it reads a link
    or a copy in a folder of the model cache `cache`: ovtrio/gguf/engine_file.py), and the folder is
    reused while the file is unchanged. A file with tensor types the engine cannot read
    is rewritten first, as a main model's is (ovtrio/gguf/convert.py).
    """
    if path.is_dir():
        if not (path / "openvino_model.xml").is_file():
            raise ModelLoadError(f"draft model folder {path} has no openvino_model.xml")
        return path
    if not path.is_file() or path.suffix.lower() != ".gguf":
        raise ModelLoadError(f"draft model {path} is neither an OpenVINO IR folder nor a .gguf file")
    path = _engine_readable_draft(path, cache, preference)
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    folder = cache / "drafts" / key
    done = folder / "openvino_tokenizer.xml"
    if (folder / "openvino_model.xml").is_file() and done.is_file():
        return folder
    log.info("converting draft model %s to OpenVINO IR in %s (once)", path, folder)
    _convert_gguf(path, folder)
    return folder


def _engine_readable_draft(path: Path, cache: Path, preference: Preference) -> Path:
    from ovtrio.gguf.convert import ConversionError, needs_conversion
    from ovtrio.gguf.header import GGUFFormatError, read_gguf_header
    from ovtrio.loading.gguf_converted import converted_in_cache

    try:
        if not needs_conversion(read_gguf_header(path)):
            return path
        converted = converted_in_cache(path, cache, preference)
    except (OSError, GGUFFormatError, ConversionError) as exc:
        raise ModelLoadError(f"cannot convert draft model {path}: {exc}") from None
    log.info("draft model %s: tensor types the engine cannot read, %s", path, "; ".join(converted.lines))
    return converted.path


def _convert_gguf(path: Path, folder: Path) -> None:
    import openvino_genai

    work = folder.with_name(folder.name + f".tmp{os.getpid()}")
    work.mkdir(parents=True, exist_ok=True)
    (work / path.name).unlink(missing_ok=True)  # left by an earlier try of this process
    link = place_for_engine(path, work)
    try:
        # The pipeline's GGUF reader writes the model; the tokenizer's writes the
        # tokenizer and detokenizer. A one-block cache keeps the throwaway pipeline small.
        scheduler = openvino_genai.SchedulerConfig()
        scheduler.num_kv_blocks = 1
        scheduler.cache_size = 0
        openvino_genai.ContinuousBatchingPipeline(str(link), scheduler, "CPU", {"enable_save_ov_model": True})
        openvino_genai.Tokenizer(str(link), enable_save_ov_model=True)
    except Exception as exc:  # noqa: BLE001 (the engine's RuntimeError, or a file error)
        raise ModelLoadError(f"cannot convert draft model {path}: {_last_line(exc)}") from None
    finally:
        link.unlink(missing_ok=True)
    try:
        work.rename(folder)
    except OSError:  # another process converted it meanwhile
        if not (folder / "openvino_model.xml").is_file():
            raise


def _last_line(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__
