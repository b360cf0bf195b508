"""API keys: with any key configured, every API route and the WebSocket handshake need
`Authorization: Bearer <key>`.

The probes stay open, because Kubernetes and load balancers call them without
credentials; so does /metrics unless `protect_metrics` is set (Prometheus scrapers can
send a bearer token, but many setups scrape inside a trusted network). A refusal is a
401 in OpenAI's shape and words (`invalid_request_error`; code `invalid_api_key` for a
wrong key, none for a missing one), checked before routing, so an unknown path gives
away nothing either. Keys are compared with `hmac.compare_digest` against every
configured key, so the time taken says nothing about how much of a key matched or
which key it was.

Anthropic's Messages API sends its key as `x-api-key`: under its paths that header is
accepted as well as the bearer token (and a refusal is written in Anthropic's shape,
ovtrio/api/messages/errors.py).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from quart import Quart, Response, request, websocket

from ovtrio.api.errors import APIError, error_response

OPEN_PATHS = frozenset({"/health", "/health/ready", "/ready", "/v2/health/live", "/v2/health/ready"})
METRICS_PATH = "/metrics"
X_API_KEY_PATHS = ("/v1/messages", "/v3/messages")

MISSING = (
    "You didn't provide an API key. You need to provide your API key in an Authorization header"
    " using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
)
INCORRECT = "Incorrect API key provided."


class KeyCheck:
    """Decides whether a request may pass, from its path and Authorization header."""

    def __init__(self, keys: Iterable[str], protect_metrics: bool = False) -> None:
        self._keys = tuple(key.encode() for key in keys)
        self._open = OPEN_PATHS if protect_metrics else OPEN_PATHS | {METRICS_PATH}

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def refusal(self, path: str, authorization: str | None, x_api_key: str | None = None) -> APIError | None:
        """None if the request may pass, else the 401 to answer with."""
        if not self._keys or path in self._open:
            return None
        if x_api_key and not authorization and any(path == p or path.startswith(p + "/") for p in X_API_KEY_PATHS):
            authorization = f"Bearer {x_api_key}"
        scheme, _, token = (authorization or "").strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return APIError(401, MISSING, type="invalid_request_error")
        if not self._matches(token.encode()):
            return APIError(401, INCORRECT, type="invalid_request_error", code="invalid_api_key")
        return None

    def _matches(self, token: bytes) -> bool:
        found = False
        for key in self._keys:  # no early exit: every key is compared every time
            found |= hmac.compare_digest(token, key)
        return found


def install(app: Quart, check: KeyCheck) -> None:
    """Check every HTTP request and WebSocket handshake before it is routed."""
    if not check.enabled:
        return

    @app.before_request
    async def require_key() -> Response | None:
        headers = request.headers
        return _refused(check.refusal(request.path, headers.get("Authorization"), headers.get("x-api-key")))

    @app.before_websocket
    async def require_key_for_socket() -> Response | None:
        # A response before accept() becomes the HTTP answer to the handshake.
        return _refused(check.refusal(websocket.path, websocket.headers.get("Authorization")))


def _refused(error: APIError | None) -> Response | None:
    if error is None:
        return None
    response = error_response(error)
    response.headers["WWW-Authenticate"] = "Bearer"
    return response
