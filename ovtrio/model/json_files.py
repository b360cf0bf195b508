"""Reading the JSON files that sit beside a model (config.json, generation_config.json,
preprocessor_config.json, ...): a file that is missing, unreadable or not a JSON object
says nothing, so it reads as an empty object."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_json_object(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
