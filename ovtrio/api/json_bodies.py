"""Request bodies are JSON, and say so: a body sent with any other Content-Type, or
none, is refused with 415 before it is read.

Every route that takes a body reads JSON, whatever the header says; the check exists
for browsers. A page may POST to any address without asking first (no CORS preflight)
only with a "simple" Content-Type (text/plain, a form encoding) or none (a Blob body),
so without it any page could run a completion on the server through its visitor's
browser. `application/json`, with parameters (`; charset=utf-8`) or as a `+json` type,
is what the SDKs and the README's curl examples send, and what a browser sends only
after a preflight that the Origin check answers (ovtrio/api/origins.py). Requests
without a body (a GET, a DELETE, an empty POST) need no Content-Type. Like FastAPI,
which refuses non-JSON bodies for the same reason.

Ollama's routes (/api/...) read a body of any Content-Type as JSON, as Ollama does
(its documentation's `curl -d` sends a form type), from a request without an Origin
header: one no browser page sent. A page's request (which carries Origin) is held to
JSON as everywhere else.

The audio routes take what OpenAI's audio API takes, a file upload
(`multipart/form-data`), and only that. A page may send one of those without a
preflight too, but its browser adds an Origin header, which the Origin check refuses
unless the page is allowed (ovtrio/api/origins.py).
"""

from __future__ import annotations

from quart import Quart, Response, request

from ovtrio.api.errors import APIError, error_response


def is_json(mimetype: str) -> bool:
    """Whether a media type (lower case, no parameters) is JSON."""
    return mimetype == "application/json" or (mimetype.startswith("application/") and mimetype.endswith("+json"))


# Ollama's routes, which read any body as JSON from a request no page sent.
ANY_TYPE_PREFIX = "/api/"

FORM_PATHS = frozenset(
    f"/{version}/audio/{route}" for version in ("v1", "v3") for route in ("transcriptions", "translations")
)


def has_body(content_length: int | None, transfer_encoding: str | None) -> bool:
    return bool(content_length) or "chunked" in (transfer_encoding or "").lower()


def refusal(
    content_type: str | None, mimetype: str, content_length: int | None, transfer_encoding: str | None
) -> APIError | None:
    """None if the request may go on, else the 415 to answer with."""
    if not has_body(content_length, transfer_encoding) or is_json(mimetype):
        return None
    sent = f"Content-Type {content_type!r}" if content_type else "no Content-Type"
    return APIError(
        415,
        f"Unsupported media type: the request body was sent with {sent}; send it as JSON with"
        " 'Content-Type: application/json'.",
        code="unsupported_media_type",
    )


def install(app: Quart) -> None:
    @app.before_request
    async def require_json_body() -> Response | None:
        if request.path in FORM_PATHS:
            if request.mimetype == "multipart/form-data":
                return None
            return error_response(
                APIError(
                    415,
                    f"Unsupported media type: {request.path} takes a file upload (multipart/form-data, as OpenAI's"
                    " SDK and `curl -F` send it).",
                    code="unsupported_media_type",
                )
            )
        if request.path.startswith(ANY_TYPE_PREFIX) and "Origin" not in request.headers:
            return None
        error = refusal(
            request.headers.get("Content-Type"),
            request.mimetype,
            request.content_length,
            request.headers.get("Transfer-Encoding"),
        )
        return None if error is None else error_response(error)
