"""The leases one request holds on the models it uses (ovtrio/lifecycle/lease.py),
given back when its response has ended.

A handler returns before its response is sent: a streamed body is written after it, by
Quart, within the same ASGI call. So the leases a handler takes (ready_model, the
encoders' lookup) go into a holder set for the whole ASGI call, and are released when
that call returns: the last byte sent, or the client gone (the call is cancelled). A
WebSocket's responses each run as a task of their own and hold their own holder
(`separate`), released when that response ends, not when the socket closes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from quart import Quart

from ovtrio.lifecycle.lease import Lease

__all__ = ["HeldLeases", "hold", "install", "separate"]


class HeldLeases:
    """The leases of one request (or one WebSocket response)."""

    def __init__(self) -> None:
        self._leases: list[Lease] = []

    def add(self, lease: Lease) -> None:
        self._leases.append(lease)

    def release(self) -> None:
        """Give every lease back (each once, however often this is called)."""
        leases, self._leases = self._leases, []
        for lease in leases:
            lease.release()


_HELD: ContextVar[HeldLeases | None] = ContextVar("ovtrio_held_leases", default=None)


def hold(lease: Lease) -> None:
    """Keep `lease` until the current request's response has ended. Outside a request
    (no holder) it is a bug, not a lease to drop: the model would be unloaded under it."""
    held = _HELD.get()
    if held is None:
        lease.release()
        raise RuntimeError("a model's lease was taken outside a request")
    held.add(lease)


@contextmanager
def separate() -> Iterator[HeldLeases]:
    """The leases taken within the block go into a holder of their own, which the caller
    releases (a WebSocket response's, when it ends)."""
    held = HeldLeases()
    token = _HELD.set(held)
    try:
        yield held
    finally:
        _HELD.reset(token)


def install(app: Quart) -> None:
    """Give each HTTP request and WebSocket a holder for the whole of its ASGI call
    (outermost middleware: what runs inside it may take leases)."""
    serve = app.asgi_app

    async def asgi_app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await serve(scope, receive, send)
            return
        held = HeldLeases()
        token = _HELD.set(held)
        try:
            await serve(scope, receive, send)
        finally:
            _HELD.reset(token)
            held.release()

    app.asgi_app = asgi_app  # type: ignore[method-assign]
