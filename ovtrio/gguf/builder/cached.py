"""The IR folder built from a GGUF file (folder.py), kept in the model cache.

Where it goes: the model cache's gguf-built/<key>/, the key made of the file's identity
(cache.model_identity), this builder's format and the versions of the packages that
write and read the folder. It is built in a folder of its own and renamed into place
once whole, with a manifest of its files' sizes, so a build killed half-way leaves no
entry and a damaged entry is built again."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

from ovtrio.gguf.builder.child import build_in_child
from ovtrio.gguf.cache import ENTRY_FILES, MANIFEST, ModelIdentity, engine_versions, model_identity

log = logging.getLogger("ovtrio")

# Bumped when what a build writes changes, so older entries are not used.
FORMAT = 2
FOLDER = "gguf-built"


def _versions() -> dict[str, str]:
    versions = engine_versions()
    for package in ("transformers", "tokenizers", "gguf"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "missing"
    return versions


def build_key(identity: ModelIdentity) -> str:
    payload = json.dumps({"format": FORMAT, "model": asdict(identity), "versions": _versions()}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def _whole(folder: Path) -> bool:
    try:
        sizes = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["files"]
        return all((folder / name).stat().st_size == sizes[name] for name in ENTRY_FILES)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def built_in_cache(source: Path, cache_root: Path) -> tuple[Path, bool]:
    """The entry built from `source` under `cache_root`, and whether it was there already.
    Raises BuildError, or OSError when the cache cannot be written."""
    identity = model_identity(source)
    entries = cache_root / FOLDER
    entry = entries / build_key(identity)
    if _whole(entry):
        return entry, True
    entries.mkdir(parents=True, exist_ok=True)
    building = entries / f".building-{entry.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        lines = build_in_child(source, building)
        sizes = {name: (building / name).stat().st_size for name in ENTRY_FILES}
        manifest = {"format": FORMAT, "model": asdict(identity), "files": sizes, "log": lines}
        (building / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        if entry.exists():  # a damaged entry: renamed aside, so no reader finds half of it
            aside = entries / f".discarded-{entry.name}-{uuid.uuid4().hex[:8]}"
            entry.rename(aside)
            shutil.rmtree(aside, ignore_errors=True)
        try:
            building.rename(entry)
        except OSError:
            if not _whole(entry):
                raise
            # Another server built the same entry first: theirs is as good.
    finally:
        shutil.rmtree(building, ignore_errors=True)
    for line in lines:
        log.info("%s: %s", source.name, line)
    return entry, False


@contextmanager
def built_for_now(source: Path) -> Iterator[Path]:
    """The IR folder built into a temporary folder, removed when the block ends (no cache)."""
    folder = Path(tempfile.mkdtemp(prefix="ovtrio-built-"))
    try:
        for line in build_in_child(source, folder / "model"):
            log.info("%s: %s", source.name, line)
        yield folder / "model"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def built_folder(source: Path, cache_root: Path | None) -> Iterator[tuple[Path, str]]:
    """The IR folder of the GGUF file `source` and where it came from: the cache at
    `cache_root` (None: no cache), built now if it has none; where the cache cannot be
    written, built into a temporary folder for the block's length. Blocking (seconds to
    minutes): the caller's thread. Raises BuildError when the file cannot be built."""
    started = time.perf_counter()
    if cache_root is not None:
        try:
            entry, found = built_in_cache(source, cache_root)
        except OSError as exc:
            log.warning("cannot keep the model built from %s in the model cache (%s); building it for now", source, exc)
        else:
            if found:
                yield entry, f"built from GGUF before, cached in {entry}"
            else:
                yield entry, f"built from GGUF in {time.perf_counter() - started:.1f} s, cached in {entry}"
            return
    with built_for_now(source) as folder:
        yield folder, f"built from GGUF in {time.perf_counter() - started:.1f} s, not cached"
