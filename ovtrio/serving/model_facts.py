"""What a served model's files say of it, for clients that describe models (Ollama's
/api/tags, /api/show): their size, when they last changed, a digest of that version of
them, the format and the architecture (an IR folder's config.json `model_type`, a GGUF
file's `general.architecture`). Read from the disk, once per version of the files."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ovtrio.gguf.header import read_gguf_header


@dataclass(frozen=True)
class ModelFacts:
    size: int  # bytes of its files
    modified: float  # the newest file's mtime, seconds since the epoch
    digest: str  # sha256 of the files' paths, sizes and mtimes: changes when they do
    format: str  # "gguf" or "openvino"
    architecture: str  # "" when the files do not say


def model_facts(path: Path | None) -> ModelFacts:
    """The facts of the model at `path` (a GGUF file or a folder); empty ones for a
    model without files (or whose files cannot be read now)."""
    if path is None:
        return ModelFacts(0, 0.0, "", "", "")
    try:
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        stats = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    except OSError:
        return ModelFacts(0, 0.0, "", "", "")
    return _facts(path, tuple(stats))


@lru_cache(maxsize=64)
def _facts(path: Path, stats: tuple[tuple[str, int, int], ...]) -> ModelFacts:
    size = sum(size for _, size, _ in stats)
    modified = max((mtime for _, _, mtime in stats), default=0) / 1e9
    digest = hashlib.sha256(repr(stats).encode()).hexdigest()
    gguf = path.is_file() and path.suffix.lower() == ".gguf"
    return ModelFacts(size, modified, digest, "gguf" if gguf else "openvino", _architecture(path, gguf))


def _architecture(path: Path, gguf: bool) -> str:
    try:
        if gguf:
            return str(read_gguf_header(path).architecture or "")
        config = json.loads((path / "config.json").read_text())
        return str(config.get("model_type") or "") if isinstance(config, dict) else ""
    except (OSError, ValueError):
        return ""
