"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.

`api_error` is the one mapping from anything that can go wrong (a refused request
field, a prompt or output format that cannot be used, settings the engine refuses, an
engine failure, an HTTP error, a bug) to an APIError. An APIError is then written as an
HTTP body or an SSE error chunk (`body()`), or a WebSocket error event (`event()`), so
no client ever sees an HTML page or a traceback.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from quart import Response, has_request_context, request
from werkzeug.exceptions import HTTPException

from ovtrio.errors import FieldError
from ovtrio.scheduler import SHUTTING_DOWN, Failed, NotAccepting, Overloaded
from ovtrio.serving.residency import MODEL_UNLOADED

log = logging.getLogger("ovtrio")

INTERNAL_ERROR = "The server had an error while processing your request."


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _default_type(status)
        self.retry_after = retry_after  # seconds, sent as the Retry-After header

    def body(self) -> dict[str, Any]:
        """The HTTP response body, also sent as an SSE chunk when a stream fails."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def event(self, stream_id: Any = None) -> dict[str, Any]:
        """The WebSocket `error` event (Responses WebSocket mode)."""
        event: dict[str, Any] = {
            "type": "error",
            "code": self.code or self.type,
            "message": self.message,
            "param": self.param,
            "sequence_number": 0,
        }
        if stream_id is not None:
            event["stream_id"] = stream_id
        return event


# Paths that answer errors in another API's shape (Anthropic's Messages API), and how.
_SHAPES: dict[tuple[str, ...], Callable[[APIError], Response]] = {}


def register_error_shape(prefixes: tuple[str, ...], respond: Callable[[APIError], Response]) -> None:
    """Answer every error on paths starting with one of `prefixes` with `respond`:
    errors raised by handlers, routing errors and refused API keys alike."""
    _SHAPES[prefixes] = respond


def error_response(error: APIError) -> Response:
    """An APIError as an HTTP response (in the shape the request's path speaks)."""
    if _SHAPES and has_request_context():
        for prefixes, respond in _SHAPES.items():
            if any(request.path == prefix or request.path.startswith(prefix + "/") for prefix in prefixes):
                return respond(error)
    response = Response(json.dumps(error.body(), ensure_ascii=False), status=error.status, mimetype="application/json")
    if error.retry_after is not None:
        response.headers["Retry-After"] = str(error.retry_after)
    return response


# What a request can be refused for, before or as it reaches the engine.
REQUEST_ERRORS = (APIError, ValidationError, FieldError, NotAccepting, Overloaded)

# A client refused or cut off by a shutdown may retry at once: behind a load balancer
# the retry reaches another replica (this one's readiness already says 503).
SHUTDOWN_RETRY_AFTER = 1

_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}


def api_error(error: BaseException | Failed) -> APIError:
    """The APIError for anything raised while serving a request, or an engine failure."""
    if isinstance(error, APIError):
        return error
    if isinstance(error, ValidationError):
        return from_validation_error(error)
    if isinstance(error, FieldError):  # a prompt, image, output format, setting or input refused
        return invalid(error.client_message(), error.param, error.code)
    if isinstance(error, NotAccepting):
        return shutting_down()
    if isinstance(error, Overloaded):
        return overloaded(str(error), error.retry_after)
    if isinstance(error, Failed):
        if error.code == SHUTTING_DOWN:
            return shutting_down(cut=True)
        if error.code == MODEL_UNLOADED:
            return APIError(503, error.message, code=MODEL_UNLOADED, retry_after=SHUTDOWN_RETRY_AFTER)
        if error.code == "out_of_memory":
            return APIError(503, error.message, code="out_of_memory")
        if error.code == "slow_reader_timeout":
            return APIError(408, error.message, code=error.code)
        return APIError(500, error.message, code=error.code)
    if isinstance(error, HTTPException):
        status = error.code or 500
        return APIError(status, error.description or error.name, code=_HTTP_CODES.get(status))
    log.error("unhandled error", exc_info=error)
    return APIError(500, INTERNAL_ERROR, code="internal_error")


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


def overloaded(message: str, retry_after: int) -> APIError:
    """A 429 as OpenAI words a rate limit (type "requests", code "rate_limit_exceeded"),
    with a Retry-After header in seconds."""
    return APIError(429, message, type="requests", code="rate_limit_exceeded", retry_after=retry_after)


def invalid(message: str, param: str | None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def shutting_down(*, cut: bool = False) -> APIError:
    """A request refused because the server is draining, or `cut` off when the drain ended."""
    message = (
        "The server shut down before this request finished; retry it."
        if cut
        else "The server is shutting down and takes no new requests; retry shortly."
    )
    return APIError(503, message, code="server_shutting_down", retry_after=SHUTDOWN_RETRY_AFTER)


# How much of a requested model name an error message repeats: enough to recognise it,
# without sending a megabyte-long name back.
SHOWN_NAME_CHARS = 200


def model_not_found(name: str) -> APIError:
    shown = name if len(name) <= SHOWN_NAME_CHARS else name[:SHOWN_NAME_CHARS] + "…"
    return APIError(
        404,
        f"The model '{shown}' does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
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
