"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.

Handlers raise APIError; one error handler turns it (and everything else) into a JSON
response, so no client ever sees an HTML page or a traceback.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _default_type(status)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _default_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 404:
        return "invalid_request_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def invalid(message: str, param: str | None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def model_not_found(name: str) -> APIError:
    return APIError(
        404, f"The model '{name}' does not exist or you do not have access to it.", param="model", code="model_not_found"
    )


# Parts of a pydantic error location that name a type (union members, validators), not a field.
_TYPE_TAG = re.compile(r"[\[\]\-<>]|^(str|int|float|bool|dict|list|none)$|^[A-Z]")


def param_path(loc: tuple[Any, ...]) -> str | None:
    """('messages', 0, 'content') -> 'messages[0].content'."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif isinstance(part, str) and not _TYPE_TAG.search(part):
            path += f".{part}" if path else part
    return path or None


def from_validation_error(exc: ValidationError) -> APIError:
    """The first problem pydantic found, as a 400 naming the parameter."""
    errors = exc.errors(include_url=False)
    error = _most_specific(errors)
    kind = error["type"]
    if kind == "json_invalid":
        return invalid(
            "We could not parse the JSON body of your request. The body must be a valid JSON object.",
            None,
            "invalid_json",
        )
    if kind == "model_type" and not error["loc"]:
        return invalid("The request body must be a JSON object.", None, "invalid_json")
    param = param_path(tuple(error["loc"]))
    if kind == "missing":
        return invalid(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")
    if kind == "extra_forbidden":
        return invalid(f"Unrecognized request argument supplied: '{param}'.", param, "unknown_parameter")
    message = error["msg"]
    if kind.endswith("_type") or kind in {"string_type", "model_type", "list_type", "union_tag_invalid"}:
        return invalid(f"Invalid type for '{param}': {message}.", param, "invalid_type")
    return invalid(f"Invalid value for '{param}': {message}.", param, "invalid_value")


def _most_specific(errors: list[Any]) -> Any:
    """Of the errors pydantic reports for the first bad field, the most telling one.

    A union field reports one error per member; the member the client evidently meant
    is the one validation got furthest into (deepest location), and a wrong value says
    more than a wrong type.
    """
    first_field = errors[0]["loc"][:1]
    same_field = [e for e in errors if e["loc"][:1] == first_field]
    return max(same_field, key=lambda e: (len(e["loc"]), not e["type"].endswith("_type")))
