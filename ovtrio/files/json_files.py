"""Reading the JSON files that sit beside a model (config.json, generation_config.json,
preprocessor_config.json, ...): a file that is missing, unreadable or not a JSON object
says nothing, so it reads as an empty object. One that is not a regular file (a FIFO,
a link to a device) or is larger than MAX_JSON_BYTES is not read (regular_files.py):
it reads as empty too, with a warning; `check_json_file` refuses it instead."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from ovtrio.files.regular_files import MAX_JSON_BYTES, UnsafeFile, read_bounded, unsafe_reason

log = logging.getLogger("ovtrio")


def read_json_object(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(read_bounded(path, MAX_JSON_BYTES))
    except UnsafeFile as exc:
        log.warning("not reading %s: %s", path, exc)
        return {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def check_json_file(path: Path) -> str | None:
    """Why the JSON file `path` cannot be read (not a regular file, through links, or
    larger than MAX_JSON_BYTES), or None: it is missing, or fit to read. Only stat()s."""
    return unsafe_reason(path, MAX_JSON_BYTES)
