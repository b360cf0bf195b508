"""Errors in Ollama's shape, `{"error": "..."}`, with the status Ollama answers (400
bad request, 401 and 403 as the keys and origins decide, 404 model not found, 413, 429
a full queue, 503 while loading or shutting down; anything else over 500 is a 500).
Every refusal under /api is written this way, including those made before routing (API
keys, unknown paths): see `install`."""

from __future__ import annotations

import orjson
from quart import Response

from ovtrio.api import errors
from ovtrio.api.errors import APIError

PATHS = ("/api",)


def status_of(error: APIError) -> int:
    return 500 if error.status > 500 and error.status != 503 else error.status


def error_body(error: APIError) -> dict[str, str]:
    return {"error": error.message}


def error_response(error: APIError) -> Response:
    response = Response(orjson.dumps(error_body(error)), status=status_of(error), mimetype="application/json")
    if error.retry_after is not None:
        response.headers["Retry-After"] = str(error.retry_after)
    return response


def install() -> None:
    """Write every error answered under /api in Ollama's shape."""
    errors.register_error_shape(PATHS, error_response)
