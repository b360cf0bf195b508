"""Make Hypercorn's trio worker close connections that are over: after
`Connection: close`, idle keep-alive connections at their timeout or a shutdown, and any
connection as soon as its client has closed it.

After a response sent with `Connection: close` (or to an HTTP/1.0 client), Hypercorn's
h11 protocol emits `Closed`, and `TCPServer.protocol_send` answers it with
`self._close()` (`send_eof()`, then `aclose()`). That call runs inside the task that
sent the response, which Quart-Trio cancels as soon as the response is out, so
`send_eof()` raises `Cancelled` at its checkpoint and `aclose()` never runs. The idle
timer is not restarted on that path either, so `keep_alive_timeout` never fires: the
socket and its file descriptor stay open until the client closes. (The `RawData`
branch of the same method is shielded; the `Closed` branch is not.)

The keep-alive path has the same flaw. After a response on a connection that stays
open, the protocol emits `Updated(idle=True)` from that same cancelled task, and
`protocol_send` answers it by starting the idle timer (`idle_task.restart`, a
`nursery.start`), which the pending cancellation kills at once. An idle keep-alive
connection then has no timer: `keep_alive_timeout` never closes it, and neither does a
shutdown (the timer is what waits for the worker's `terminated` event), so every idle
client connection holds the server's exit until Hypercorn's graceful timeout.

When the client closes, `TCPServer._read_data` reads the EOF, tells the protocol
(`Closed`, which ends a request in flight as a disconnect) and returns, but nothing
closes the server's end: `run()` then waits for the connection's task group, where the
idle timer may be running, and closes the socket only after it. Each connection a
client opens and closes while idle (before a request, or between two) stays in
CLOSE-WAIT with its descriptor for the whole keep-alive timeout (75 s under `ovtrio
serve`): 3,000 quick open/close left 3,000 of them, and about 20,000 exhaust the
process's descriptors.

`apply()` replaces `protocol_send` with one that handles those two events in a shielded
cancel scope and leaves every other event to the original, and wraps `_read_data` so
that once it returns (EOF, a reset, or a socket already closed) the idle timer is
stopped and the socket closed at once. A client that only half-closes (shuts down its
sending side and still waits for an answer) is treated as gone, as Hypercorn already
treats it for a request in flight. The wrapper also keeps an error that a client's bytes
raise in Hypercorn's protocol (a WebSocket handshake that carries a body makes it send
two responses, and h11 raises LocalProtocolError) to that one connection: unhandled, it
ended the server's task group and with it the whole server.

It only patches the exact code it was written for (Hypercorn 0.18.0's methods,
identified by hashes of their source): any other version is left alone, with a log line,
so a fixed or reworked Hypercorn is never patched blindly.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import logging
from importlib import metadata
from typing import Any

import trio

log = logging.getLogger("ovtrio")

# sha256 of inspect.getsource() of each patched hypercorn.trio.tcp_server.TCPServer
# method in Hypercorn 0.18.0: the code whose flaws the patch works around.
PATCHED_SOURCES = {
    # Its Closed branch runs unshielded.
    "protocol_send": "225856426bff7be02990c0badb90f51f801db14ac5db0f3d0c210cafbeb528ab",
    # Returns on EOF without closing the socket.
    "_read_data": "7ca747d922c65cf1fb6bd7ceabe82b0b51bb9de218ce159d7b7e093ec279f728",
}

_applied = False


def apply() -> bool:
    """Patch Hypercorn's trio TCPServer once per process; True if it is patched."""
    global _applied
    if _applied:
        return True
    from hypercorn.events import Closed, Updated
    from hypercorn.trio.tcp_server import TCPServer

    changed = [
        name
        for name, digest in PATCHED_SOURCES.items()
        if hashlib.sha256(inspect.getsource(getattr(TCPServer, name)).encode()).hexdigest() != digest
    ]
    if changed:
        log.info(
            "hypercorn %s: its trio TCPServer.%s is not the code ovtrio's connection-close fix"
            " was written for; leaving it unpatched",
            metadata.version("hypercorn"),
            " and ".join(changed),
        )
        return False
    original_send = TCPServer.protocol_send
    original_read = TCPServer._read_data

    async def protocol_send(self: Any, event: Any) -> None:
        if isinstance(event, Closed):
            # The sending task may already be cancelled: close the socket regardless.
            with trio.CancelScope(shield=True):
                await self._close()
            await self.protocol.handle(Closed())
        elif isinstance(event, Updated) and event.idle:
            # Starting the idle timer is one nursery.start: it ends at once, shielded.
            with trio.CancelScope(shield=True):
                await original_send(self, event)
        else:
            await original_send(self, event)

    async def _read_data(self: Any) -> None:
        try:
            await original_read(self)
        except Exception as error:  # noqa: BLE001 (whatever it is, it is this connection's)
            # What the client sent drove Hypercorn's protocol into an error it does not
            # handle (a WebSocket handshake with a body does): close this connection
            # rather than let the error end the server's task group, and every other
            # connection with it.
            log.warning("closing a connection Hypercorn could not handle: %s: %s", type(error).__name__, error)
            with contextlib.suppress(Exception):
                await self.protocol.handle(Closed())
        # Nothing more can come in, and the protocol has been told (a request in flight
        # is ending as a disconnect): release the socket now, not after the idle timer.
        # Closed without `_close()`'s send_eof first: the client is gone, and send_eof
        # holds the stream's sending side across a checkpoint, where a response still
        # being written in another task would meet it and raise BusyResourceError (an
        # "Error in ASGI Framework" traceback for a client that only hung up). Closing
        # ends that send with ClosedResourceError, which Hypercorn handles.
        with trio.CancelScope(shield=True):
            await self.idle_task.stop()
            await self.stream.aclose()

    protocol_send.__doc__ = original_send.__doc__
    TCPServer.protocol_send = protocol_send  # type: ignore[method-assign]
    TCPServer._read_data = _read_data  # type: ignore[method-assign]
    _applied = True
    return True
