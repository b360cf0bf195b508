"""What every request body (and every object in one) shares: strict types, unknown
fields ignored, no NaN or Infinity, and null for an optional field meaning "not set"."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


class Body(BaseModel):
    """The base of every request body and of every object inside one."""

    # NaN and Infinity (which Python's JSON reader takes) are no value any field means.
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _null_is_the_default(cls, data: Any) -> Any:
        """OpenAI's spec marks most optional fields nullable, with null meaning "not
        set": an optional field sent as null takes its default. (A required one sent as
        null is still refused, naming it.)"""
        if isinstance(data, dict) and None in data.values():
            fields = cls.model_fields
            return {
                key: value
                for key, value in data.items()
                if value is not None or key not in fields or fields[key].is_required()
            }
        return data
