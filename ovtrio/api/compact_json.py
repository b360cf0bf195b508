"""JSON as the server writes it to a stream: compact (no space after `,` or `:`) and with
text as UTF-8 (no \\u escapes), so an event is as short as it can be; a schema's size is
measured the same way (--max-schema-bytes)."""

from __future__ import annotations

import json
from typing import Any


def compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
