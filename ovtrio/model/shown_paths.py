"""A model's path as a client may see it: its file or folder name.

Why a model failed is told to clients (a 503's message, its state in /v1/models and
/health). The reasons are written for the server's log, naming the model's absolute
path; a client learns nothing from it but how the server's disk is laid out. What a
client reads names the model's file or folder instead (a models folder's model is its
file or folder directly in it), and the log keeps the path.
"""

from __future__ import annotations

import os
from pathlib import Path


def without_model_path(reason: str, path: Path | None) -> str:
    """`reason` with each spelling of `path` (as given, absolute, with its links
    resolved) written as the path's last part."""
    if path is None:
        return reason
    spellings = {str(path), str(path.expanduser()), os.path.abspath(path.expanduser())}
    try:
        spellings.add(str(path.expanduser().resolve()))
    except (OSError, RuntimeError):  # a loop of links: the spellings above remain
        pass
    for spelling in sorted(spellings - {"", "."}, key=len, reverse=True):
        reason = reason.replace(spelling, path.name)
    return reason
