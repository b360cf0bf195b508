"""The converted GGUF file (ovtrio/gguf/convert.py) in the model cache, and what a load hands the
engine.

Where the file goes: into the model cache, as gguf-converted/<key>.gguf, the key made of
the file's identity (cache.model_identity), this converter's version and the preference.
It is written under a temporary name and linked into place once whole, so a conversion
killed half-way leaves no file under the final name (only a temporary one, removed by the
next conversion once its process is gone), and the next start converts afresh. The
engine's IR conversion of the new file is then cached as any GGUF file's is (ovtrio/gguf/cache.py),
under the new file's own identity.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from ovtrio.gguf.cache import ModelIdentity, cache_folder, model_identity
from ovtrio.gguf.convert import ConversionError, convert_in_child
from ovtrio.gguf.targets import Preference

if TYPE_CHECKING:
    from ovtrio.model.source import ModelSource
    from ovtrio.settings.server import Settings

log = logging.getLogger("ovtrio")

# Bumped when what a conversion writes changes, so older converted files are not used.
FORMAT = 1
FOLDER = "gguf-converted"


def conversion_key(identity: ModelIdentity, preference: Preference) -> str:
    payload = json.dumps(
        {"format": FORMAT, "model": asdict(identity), "preference": preference, "gguf": metadata.version("gguf")},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def _partial_name(key: str) -> str:
    return f".{key}.{os.getpid()}.partial"


def _remove_abandoned(folder: Path) -> None:
    """Temporary files of conversions whose process has gone (killed half-way)."""
    for partial in folder.glob(".*.partial"):
        try:
            pid = int(partial.name.split(".")[2])  # ".<key>.<pid>.partial", ".<key>.<pid>.json.partial"
            os.kill(pid, 0)
        except ProcessLookupError:
            partial.unlink(missing_ok=True)
        except (ValueError, PermissionError, OSError):
            continue


@dataclass(frozen=True)
class Converted:
    path: Path  # the file the engine reads
    lines: list[str]  # what was converted, one line per type
    cached: bool  # found in the cache, not converted now
    seconds: float


def converted_in_cache(
    source: Path, cache_root: Path, preference: Preference, timeout: float | None = None
) -> Converted:
    """The converted file for `source` in the cache at `cache_root`: found, or made now
    (within `timeout` seconds). Raises OSError when the cache cannot be written (or is
    full), ConversionError when the file cannot be converted; either way, nothing it
    wrote is left."""
    started = time.perf_counter()
    found = cached_conversion(source, cache_root, preference)
    if found is not None:
        return found
    folder = cache_root / FOLDER
    key = conversion_key(model_identity(source), preference)
    final = folder / f"{key}.gguf"
    folder.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(folder)
    partial = folder / _partial_name(key)
    try:
        lines = convert_in_child(source, partial, preference, timeout)
        summary_file = folder / f".{key}.{os.getpid()}.json.partial"
        summary_file.write_text(json.dumps({"source": str(source), "converted": lines}), encoding="utf-8")
        os.replace(summary_file, final.with_suffix(".json"))
        try:
            # A link, not a rename: of two servers converting the same file at once, the
            # first to finish publishes, and the file another may be loading stays as it is.
            os.link(partial, final)
        except FileExistsError:
            pass
    finally:
        partial.unlink(missing_ok=True)
    return Converted(final, lines, False, time.perf_counter() - started)


def cached_conversion(source: Path, cache_root: Path, preference: Preference) -> Converted | None:
    """The converted file for `source` in the cache at `cache_root`, if there is one."""
    final = cache_root / FOLDER / f"{conversion_key(model_identity(source), preference)}.gguf"
    return Converted(final, _cached_lines(final), True, 0.0) if final.is_file() else None


def _cached_lines(final: Path) -> list[str]:
    try:
        return list(json.loads(final.with_suffix(".json").read_text(encoding="utf-8"))["converted"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


@contextmanager
def converted_for_now(source: Path, preference: Preference, timeout: float | None = None) -> Iterator[Converted]:
    """The converted file in a temporary folder, removed when the block ends (no cache)."""
    started = time.perf_counter()
    folder = Path(tempfile.mkdtemp(prefix="ovtrio-gguf-"))
    try:
        target = folder / source.name
        lines = convert_in_child(source, target, preference, timeout)
        yield Converted(target, lines, False, time.perf_counter() - started)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def engine_readable(source: ModelSource, settings: Settings, phases: dict[str, float]) -> Iterator[ModelSource]:
    """`source`, or (a GGUF file with tensor types the engine cannot read) the same model
    rewritten into types it reads: kept in the model cache, found there on later starts;
    without the cache, written to a temporary folder removed once the block ends.
    Blocking (seconds to minutes for a large model): the caller's thread, not the event
    loop's. Raises ModelLoadError when the file cannot be converted."""
    if source.kind != "gguf" or not source.convert_tensors:
        yield source
        return
    started = time.perf_counter()
    # A prebuilt cache (filled by `ovtrio convert` when an image was built) holds the
    # converted file under the path its IR entry was keyed by.
    prebuilt = Path(settings.prebuilt_cache_dir).expanduser() if settings.prebuilt_cache_dir else None
    found = cached_conversion(source.path, prebuilt, settings.gguf_conversion) if prebuilt else None
    if found is not None:
        phases["conversion"] = time.perf_counter() - started
        _log_conversion(source, found)
        yield dataclasses.replace(source, path=found.path, convert_tensors=False)
        return
    timeout = settings.load_timeout or None
    try:
        if settings.model_cache:
            try:
                converted = converted_in_cache(
                    source.path, cache_folder(settings.cache_dir, settings.data_dir), settings.gguf_conversion, timeout
                )
            except OSError as exc:
                log.warning("cannot keep the converted GGUF file in the model cache (%s); converting for now", exc)
            else:
                phases["conversion"] = time.perf_counter() - started
                _log_conversion(source, converted)
                try:
                    yield dataclasses.replace(source, path=converted.path, convert_tensors=False)
                except BaseException:
                    if not converted.cached:  # the engine refused it: keep nothing of it
                        _remove_converted(converted.path)
                    raise
                return
        with converted_for_now(source.path, settings.gguf_conversion, timeout) as converted:
            phases["conversion"] = time.perf_counter() - started
            _log_conversion(source, converted)
            yield dataclasses.replace(source, path=converted.path, convert_tensors=False)
    except ConversionError as exc:
        from ovtrio.model.source import ModelLoadError

        raise ModelLoadError(f"cannot load model {source.path}: {exc}") from None


def _remove_converted(final: Path) -> None:
    """A converted file (and what it says it is) the engine did not load."""
    log.info("removing %s: the engine did not load it", final)
    final.unlink(missing_ok=True)
    final.with_suffix(".json").unlink(missing_ok=True)


def _log_conversion(source: ModelSource, converted: Converted) -> None:
    if converted.cached:
        log.info(
            "tensor types the engine cannot read in %s: converted before, from the cache (%s): %s",
            source.path,
            converted.path,
            "; ".join(converted.lines),
        )
        return
    log.info(
        "tensor types the engine cannot read in %s: converted in %.1f s into %s",
        source.path,
        converted.seconds,
        converted.path,
    )
    for line in converted.lines:
        log.info("%s", line)
