"""`keep_alive`, as Ollama's requests carry it: how long the model stays loaded after
this request, when no other request comes. A number of seconds, or a duration
("30s", "5m", "1h30m", Go's spelling); 0 unloads the model once the request is done
(once its response has ended: ovtrio/lifecycle/lease.py), a negative value
keeps it loaded for good."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BeforeValidator

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def seconds_of(value: Any) -> float:
    """`value` in seconds; ValueError when it is neither a number nor a duration, or
    not finite (NaN compares false with every time: the model would never unload)."""
    seconds = _seconds(value)
    if not math.isfinite(seconds):
        raise ValueError("keep_alive must be a finite number of seconds (a negative one keeps the model loaded)")
    return seconds


def _seconds(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("keep_alive must be a number of seconds or a duration such as '5m'")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            return float(text)
        except ValueError:
            pass
        sign = -1.0 if text.startswith("-") else 1.0
        body = text.lstrip("+-")
        parts = _PART.findall(body)
        if parts and "".join(number + unit for number, unit in parts) == body:
            return sign * sum(float(number) * _UNITS[unit] for number, unit in parts)
    raise ValueError("keep_alive must be a number of seconds or a duration such as '5m'")


KeepAlive = Annotated[float, BeforeValidator(seconds_of)]
