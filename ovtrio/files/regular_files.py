"""Opening the files of a model, trusting nothing about what sits under their names.

A models folder is anyone's to fill: a name the server reads may be a FIFO (opening it
waits for a writer that never comes), a link to a device (`/dev/zero` reads without
end) or a sparse file of any size. A model's files are opened here: without waiting
(O_NONBLOCK), then checked to be regular files (links followed, and what they lead to
checked once open, so a name swapped between a check and the open cannot slip by), and
a small file (a JSON config) is read only up to a bound.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

# The most bytes of a JSON file beside a model (config.json, generation_config.json, ...):
# kilobytes in any real export, a few megabytes with the largest label tables.
MAX_JSON_BYTES = 16 << 20


class UnsafeFile(OSError):
    """A model's file that is not a regular file, or larger than it may be."""


def _kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a folder"),
    ):
        if test(mode):
            return kind
    return "not a regular file"


def open_regular(path: Path | str) -> BinaryIO:
    """`path` open for reading in binary, if it is a regular file (through links);
    UnsafeFile if it is anything else, OSError if it cannot be opened."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafeFile(f"{Path(path).name} is {_kind(mode)}, not a regular file")
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def read_bounded(path: Path | str, limit: int) -> bytes:
    """The whole of the regular file `path`, refused (UnsafeFile) past `limit` bytes."""
    with open_regular(path) as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise UnsafeFile(f"{Path(path).name} is larger than {limit} bytes")
    return data


def unsafe_reason(path: Path | str, limit: int | None = None) -> str | None:
    """Why `path` is not fit to read (not a regular file through its links, or past
    `limit` bytes), or None: it is missing, or fit. Only stat()s, which never waits."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(status.st_mode):
        return f"{Path(path).name} is {_kind(status.st_mode)}, not a regular file"
    if limit is not None and status.st_size > limit:
        return f"{Path(path).name} is larger than {limit} bytes"
    return None
