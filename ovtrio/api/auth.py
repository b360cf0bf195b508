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

A browser's WebSocket API cannot set headers, so the handshake may carry the key in
`Sec-WebSocket-Protocol` instead, as OpenAI's Realtime API takes it from browsers: the
client offers the subprotocols `responses` and `openai-insecure-api-key.<key>`, and the
server answers with `responses` (never echoing the key). The Authorization header wins
when both are sent. A subprotocol travels like a header, in the handshake, not in the
URL, so the key does not end up in access logs or the browser's history.

Anthropic's Messages API sends its key as `x-api-key`: under its paths that header is
accepted as well as the bearer token (and a refusal is written in Anthropic's shape,
ovtrio/api/messages/errors.py).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from typing import Any

from quart import Quart, Response, request, websocket

from ovtrio.api.errors import APIError, error_response

OPEN_PATHS = frozenset({"/health", "/health/ready", "/ready", "/v2/health/live", "/v2/health/ready"})
METRICS_PATH = "/metrics"
# The subprotocol a WebSocket client offers with its key, and the one it is answered with.
SOCKET_KEY_PREFIX = "openai-insecure-api-key."
SOCKET_SUBPROTOCOL = "responses"
X_API_KEY_PATHS = ("/v1/messages", "/v3/messages")

MISSING = (
    "You didn't provide an API key. You need to provide your API key in an Authorization header"
    " using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
)
INCORRECT = "Incorrect API key provided."


class KeyCheck:
    """Decides whether a request may pass, from its path and Authorization header."""

    def __init__(self, keys: Iterable[str], protect_metrics: bool = False, open_paths: Iterable[str] = ()) -> None:
        """`open_paths`: more paths that need no key (the playground's page and files,
        which hold no secret and must load before the user has typed the key)."""
        self._keys = tuple(key.encode() for key in keys)
        self._open = OPEN_PATHS | frozenset(open_paths)
        if not protect_metrics:
            self._open |= {METRICS_PATH}

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
        return _refused(check.refusal(websocket.path, socket_authorization(websocket.headers)))


def socket_authorization(headers: Any) -> str | None:
    """The handshake's Authorization header, or else the key offered as a subprotocol
    (`openai-insecure-api-key.<key>`) as a bearer credential."""
    authorization = headers.get("Authorization")
    if authorization:
        return authorization
    for protocol in offered_subprotocols(headers):
        if protocol.startswith(SOCKET_KEY_PREFIX):
            return "Bearer " + protocol[len(SOCKET_KEY_PREFIX) :]
    return None


def offered_subprotocols(headers: Any) -> list[str]:
    return [
        item.strip() for value in headers.getlist("Sec-WebSocket-Protocol") for item in value.split(",") if item.strip()
    ]


def socket_subprotocol(offered: Iterable[str]) -> str | None:
    """The subprotocol to accept a handshake with: `responses` when the client offered it
    (a browser fails the connection unless one of the protocols it offered is chosen)."""
    return SOCKET_SUBPROTOCOL if SOCKET_SUBPROTOCOL in offered else None


def _refused(error: APIError | None) -> Response | None:
    if error is None:
        return None
    response = error_response(error)
    response.headers["WWW-Authenticate"] = "Bearer"
    return response
