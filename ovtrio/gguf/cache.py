"""What the engine builds from a GGUF file, kept on disk so the next start skips it.

Loading a GGUF file, OpenVINO GenAI converts the weights into an OpenVINO model and
builds the tokenizer and detokenizer models from the vocabulary in the header, which
takes seconds; from the IR the tokenizer loads many times faster and the model costs
little more than the CPU plugin's compile (see docs/benchmarks.md#loading-a-model).
So the first start converts once, into an entry of the cache folder, and later starts
load the entry.

The engine writes what it converts only next to the GGUF file it was given
(`enable_save_ov_model`), and the user's model folder is not ours to write. So the
build happens in a temporary folder of the cache holding a symbolic link to the GGUF
file (or a copy, when this process cannot write the file: engine_file.py), and the
finished folder is renamed into place: a reader sees a whole entry or
none, and of two servers building the same entry at once, the second rename loses
and its copy is dropped.

An entry is keyed by the model file's identity (resolved path, size, modification
time and a hash of its first MiB) and the versions of openvino, openvino-genai and
openvino-tokenizers. Device and precision hints are not in the key: the entry holds
the device-independent IR, and the hints apply when it is compiled.

The compiled blob (OpenVINO's CACHE_DIR) is not kept: the CPU plugin does not load a
model with PagedAttention from its cache (LOADED_FROM_CACHE stays false with
openvino 2026.4; the blob is written and read, then the model is compiled again), so
on CPU it only costs the write.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from ovtrio.gguf.engine_file import place_for_engine

log = logging.getLogger("ovtrio")

# Bumped when the layout of an entry changes, so older entries are not read.
FORMAT = 1
ENGINE_PACKAGES = ("openvino", "openvino-genai", "openvino-tokenizers")
ENTRY_FILES = (
    "openvino_model.xml",
    "openvino_model.bin",
    "openvino_tokenizer.xml",
    "openvino_tokenizer.bin",
    "openvino_detokenizer.xml",
    "openvino_detokenizer.bin",
)
MANIFEST = "entry.json"
_HEAD_BYTES = 1 << 20


class CacheEntryError(Exception):
    """A cache entry exists but cannot be used; the message says why."""


def default_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """$XDG_CACHE_HOME/ovtrio, or ~/.cache/ovtrio."""
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ovtrio"


def cache_folder(cache_dir: str | None, data_dir: str | None, environ: Mapping[str, str] | None = None) -> Path:
    """The model cache's folder: cache_dir; else DATA_DIR/cache; else the user's
    (default_cache_dir)."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    if data_dir:
        return Path(data_dir).expanduser() / "cache"
    return default_cache_dir(environ)


@dataclass(frozen=True)
class ModelIdentity:
    """What tells one model file from another without reading all of it."""

    path: str
    size: int
    mtime_ns: int
    head_sha256: str


def model_identity(path: Path) -> ModelIdentity:
    resolved = path.resolve()
    stat = resolved.stat()
    with open(resolved, "rb") as file:
        head = hashlib.sha256(file.read(_HEAD_BYTES)).hexdigest()
    return ModelIdentity(str(resolved), stat.st_size, stat.st_mtime_ns, head)


def engine_versions() -> dict[str, str]:
    """Installed versions of the packages that build and read an entry."""
    versions = {}
    for package in ENGINE_PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "missing"
    return versions


def entry_key(identity: ModelIdentity, versions: Mapping[str, str]) -> str:
    """The name of the entry for this model file built by these engine versions."""
    payload = json.dumps({"format": FORMAT, "model": asdict(identity), "engine": dict(versions)}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


class ModelCache:
    """Entries under `root`/gguf/<key>/, each a folder the engine loads as an IR model."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.entries = root / "gguf"

    def entry(self, key: str) -> Path:
        return self.entries / key

    def lookup(self, key: str) -> Path | None:
        """The entry's folder; None if there is none; CacheEntryError if it is broken."""
        folder = self.entry(key)
        if not folder.is_dir():
            return None
        try:
            with open(folder / MANIFEST, encoding="utf-8") as file:
                manifest = json.load(file)
            sizes = manifest["files"]
        except (OSError, ValueError, KeyError, TypeError):
            raise CacheEntryError("no readable manifest") from None
        for name in ENTRY_FILES:
            try:
                size = (folder / name).stat().st_size
            except OSError:
                raise CacheEntryError(f"{name} is missing") from None
            if size != sizes.get(name):
                raise CacheEntryError(f"{name} has {size} bytes, not {sizes.get(name)}")
        return folder

    def discard(self, key: str) -> None:
        """Remove an entry: renamed aside first, so no reader finds half of it."""
        folder = self.entry(key)
        aside = self.entries / f".discarded-{key}-{uuid.uuid4().hex[:8]}"
        try:
            folder.rename(aside)
        except OSError:
            return  # gone already (another server discarded it)
        shutil.rmtree(aside, ignore_errors=True)

    def remove_builds_of(self, pid: int) -> None:
        """Remove what a build by process `pid` left (a process killed half-way)."""
        for folder in self.entries.glob(f".building-*-{pid}-*"):
            shutil.rmtree(folder, ignore_errors=True)

    @contextmanager
    def building(self, key: str, model_path: Path, identity: ModelIdentity, replacing: bool = False) -> Iterator[Path]:
        """A path to hand the engine instead of `model_path`, in a temporary folder
        where the engine writes what it converts; published as entry `key` when the
        block ends without an exception, dropped otherwise. With `replacing`, what is
        published replaces an entry already there (one the engine could not load);
        without, an entry already there stays. Raises OSError when the cache folder
        cannot be written."""
        self.entries.mkdir(parents=True, exist_ok=True)
        building = self.entries / f".building-{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        building.mkdir()
        try:
            link = place_for_engine(model_path, building)
            yield link
            link.unlink()
            missing = [name for name in ENTRY_FILES if not (building / name).is_file()]
            if missing:
                raise OSError(f"the engine did not write {', '.join(missing)}")
            manifest = {
                "format": FORMAT,
                "model": asdict(identity),
                "engine": engine_versions(),
                "files": {name: (building / name).stat().st_size for name in ENTRY_FILES},
            }
            (building / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
            if replacing:
                self.discard(key)
            try:
                building.rename(self.entry(key))
            except OSError:
                if not self.entry(key).is_dir():
                    raise
                # Another server published the same entry first: theirs is as good.
        finally:
            shutil.rmtree(building, ignore_errors=True)
