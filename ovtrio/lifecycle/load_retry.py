"""When a model whose load failed is loaded again: not within RETRY_AFTER seconds of the
failure, unless its files changed meanwhile. A load holds the server's one load turn
(ovtrio/serving/residency.py) for as long as it takes, and may first unload another
model to make room: a client asking again and again for a broken model would otherwise
hold up everyone's loads and empty the others' places. Its requests hear the failure's
reason at once instead, with Retry-After. Generation models (ovtrio/serving/
failed_loads.py) and encoders (ovtrio/embedding/on_demand.py) follow the same rule."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import trio

# Seconds after a failed load during which the model is not loaded again.
RETRY_AFTER = 10.0

# A model's files as they were: the newest change among them, and their total size.
FilesVersion = tuple[int, int] | None


def files_version(path: Path | None) -> FilesVersion:
    """The version of a model's file, or of the files directly in its folder: rewriting
    a file in place changes it, which a folder's own mtime does not show."""
    if path is None:
        return None
    try:
        status = path.stat()
        if not path.is_dir():
            return status.st_mtime_ns, status.st_size
        newest, size = status.st_mtime_ns, 0
        for entry in path.iterdir():
            entry_status = entry.stat()
            newest = max(newest, entry_status.st_mtime_ns)
            size += entry_status.st_size
    except OSError:
        return None
    return newest, size


@dataclass(frozen=True)
class FailedLoad:
    """A load that failed (trio's clock), and the model's files as they were then."""

    at: float
    files: FilesVersion

    @classmethod
    def now(cls, path: Path | None) -> FailedLoad:
        return cls(trio.current_time(), files_version(path))

    def too_soon(self, path: Path | None) -> bool:
        """Whether the model failed a moment ago, and its files are as they were."""
        return trio.current_time() - self.at < RETRY_AFTER and files_version(path) == self.files

    def retry_after(self) -> int:
        """Whole seconds until the model may be loaded again (at least 1)."""
        return max(1, math.ceil(RETRY_AFTER - (trio.current_time() - self.at)))
