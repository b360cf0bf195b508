"""Errors in Anthropic's shape, `{"type": "error", "error": {"type", "message"}}` (and
`details` where Anthropic defines one), with the status codes Anthropic documents, so
that Anthropic's SDKs raise their own classes (BadRequestError, AuthenticationError,
NotFoundError, RateLimitError, OverloadedError, ...). Every refusal on the Messages
routes is written this way, including those made before routing (API keys, unknown
paths under /v1/messages): see `install`.

A server that cannot take the request now (a model still loading, a drain, a full KV
cache: 503 elsewhere) answers 529 `overloaded_error`, Anthropic's word for it.
"""

from __future__ import annotations

from pydantic_core import to_json
from quart import Response

from ovtrio.api import errors
from ovtrio.api.errors import APIError
from ovtrio.api.messages.objects import DetailedErrorDetails, ErrorDetails, ErrorEvent

PATHS = ("/v1/messages", "/v3/messages")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


# A request carrying `thread`, which this server does not serve. Anthropic's SDKs read
# `error.details.error_code` (anthropic's types/thread_unsupported_request_error.py, a
# 400): on this code a tool runner drops `thread` and sends the whole conversation again.
THREAD_UNSUPPORTED = "thread_unsupported_request"

# Codes answered with Anthropic's `error.details`: {"error_code": code}.
_DETAILED_CODES = frozenset({THREAD_UNSUPPORTED})


def status_of(error: APIError) -> int:
    if error.status == 503:
        return 529
    if error.status > 500:
        return 500
    return error.status


def error_event(error: APIError) -> ErrorEvent:
    """The error object: a response body, and the stream's `error` event."""
    status = status_of(error)
    kind = _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    if error.code in _DETAILED_CODES:
        details = {"error_code": error.code}
        return ErrorEvent(error=DetailedErrorDetails(type=kind, message=error.message, details=details))
    return ErrorEvent(error=ErrorDetails(type=kind, message=error.message))


def error_response(error: APIError) -> Response:
    response = Response(to_json(error_event(error)), status=status_of(error), mimetype="application/json")
    if error.retry_after is not None:
        response.headers["Retry-After"] = str(error.retry_after)
    return response


def install() -> None:
    """Write every error answered under the Messages paths in Anthropic's shape."""
    errors.register_error_shape(PATHS, error_response)
