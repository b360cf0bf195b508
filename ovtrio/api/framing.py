"""Requests whose body length is ambiguous are refused, and their connection closed.

A request with both `Content-Length` and `Transfer-Encoding` can be read two ways: the
server (h11) goes by `Transfer-Encoding`, as HTTP says, but a proxy in front may go by
`Content-Length`, and then what the proxy took for the next request is part of this
one's body, or the other way round: request smuggling. RFC 9112 (6.3) lets a server
refuse such a request and says it must close the connection after answering it. So the
answer is a 400 in OpenAI's shape with `Connection: close` (Hypercorn then closes the
connection), before the request is routed.

The body is read (and dropped) first, within the body timeout: Hypercorn closes a
connection at once when bytes arrive after a request it has been told ends the
connection, and a response sent while the body was still coming in would then be cut
off by that close whenever the client sent more after it (as a smuggling client does).
"""

from __future__ import annotations

import math

import trio
from quart import Quart, Response, request
from werkzeug.exceptions import RequestEntityTooLarge

from ovtrio.api.errors import APIError, error_response

AMBIGUOUS = (
    "The request has both a Content-Length and a Transfer-Encoding header, so its length is ambiguous;"
    " send one of them."
)


def install(app: Quart) -> None:
    """Check every HTTP request first, before anything else. (A WebSocket handshake that
    carries a body is refused by Hypercorn itself, with a 400 and a close.)"""

    @app.before_request
    async def refuse_ambiguous_length() -> Response | None:
        refusal = _refusal(request.headers)
        if refusal is not None:
            with trio.move_on_after(request.body_timeout or math.inf):
                try:
                    async for _ in request.body:
                        pass
                except RequestEntityTooLarge:
                    pass  # answered all the same; the close ends the rest
        return refusal

    # Quart runs these hooks in the order they were added: put this one before any other
    # (a refusal by another hook would answer before the body is read, on a connection
    # that then stays open).
    hooks = app.before_request_funcs[None]
    hooks.insert(0, hooks.pop())


def _refusal(headers: object) -> Response | None:
    if "Content-Length" in headers and "Transfer-Encoding" in headers:  # type: ignore[operator]
        response = error_response(APIError(400, AMBIGUOUS, code="ambiguous_request_length"))
        response.headers["Connection"] = "close"
        return response
    return None
