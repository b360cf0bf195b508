"""Handing a GGUF file to OpenVINO GenAI's GGUF reader, which opens it read-write.

The reader (gguflib) opens the file with O_RDWR|O_APPEND although it only reads it, so
a file this process cannot write fails to load with "Failed to open ... with gguf_open":
a package installed by root and served by another user, a model on a read-only volume
or in an image layer. Such a file is handed to the engine as a private copy; one this
process can write, as a symbolic link (the engine writes nothing into it). The model
cache (cache.py) makes the copy in the folder it converts in, so it is made once, at the
first start, and dropped once the conversion is kept.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("ovtrio")


def engine_can_open(path: Path) -> bool:
    """Whether the engine's GGUF reader can open `path` here: whether this process may
    write it (a read-only file system says no too)."""
    return os.access(path, os.W_OK, effective_ids=os.access in os.supports_effective_ids)


def place_for_engine(path: Path, folder: Path) -> Path:
    """`path` as the engine may open it, under `folder` with the same name: a symbolic
    link to it, or a copy if this process cannot write it. Raises OSError."""
    placed = folder / path.name
    if engine_can_open(path):
        placed.symlink_to(path.resolve())
    else:
        log.info(
            "%s is not writable here and the engine's GGUF reader opens its file read-write:"
            " converting a private copy in %s",
            path,
            folder,
        )
        shutil.copyfile(path, placed)
    return placed


@contextmanager
def openable_by_engine(path: Path) -> Iterator[Path]:
    """`path` itself if the engine can open it, else a copy in a temporary folder that
    is removed when the block ends (the engine has read what it needs by then)."""
    if engine_can_open(path):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="ovtrio-gguf-", ignore_cleanup_errors=True) as folder:
        yield place_for_engine(path, Path(folder))
