"""`metadata`, checked by OpenAI's rules so that a client cannot park megabytes in a
request."""

from __future__ import annotations

from typing import Any

from ovtrio.api.errors import invalid

# OpenAI's rules for `metadata`: at most 16 pairs, keys of at most 64 characters,
# values strings of at most 512.
METADATA_PAIRS = 16
METADATA_KEY_CHARS = 64
METADATA_VALUE_CHARS = 512


def check_metadata(value: Any, param: str = "metadata") -> dict[str, str] | None:
    """`metadata` as OpenAI validates it; a 400 naming the offending pair otherwise."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid(f"Invalid type for '{param}': expected an object of string values.", param, "invalid_type")
    if len(value) > METADATA_PAIRS:
        raise invalid(
            f"Invalid '{param}': too many properties. Expected an object with at most {METADATA_PAIRS}"
            f" properties, but got an object with {len(value)} properties instead.",
            param,
            "object_above_max_length",
        )
    for key, item in value.items():
        if len(key) > METADATA_KEY_CHARS:
            raise invalid(
                f"Invalid '{param}': keys may be at most {METADATA_KEY_CHARS} characters long, and one has {len(key)}.",
                f"{param}.{key[:METADATA_KEY_CHARS]}",
                "string_above_max_length",
            )
        if not isinstance(item, str):
            raise invalid(f"Invalid type for '{param}.{key}': expected a string.", f"{param}.{key}", "invalid_type")
        if len(item) > METADATA_VALUE_CHARS:
            raise invalid(
                f"Invalid '{param}.{key}': string too long. Expected a string with maximum length"
                f" {METADATA_VALUE_CHARS}, but got a string with length {len(item)} instead.",
                f"{param}.{key}",
                "string_above_max_length",
            )
    return value
