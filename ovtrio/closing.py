"""Make Hypercorn's trio worker close connections that are meant to close: after
`Connection: close`, and idle keep-alive connections at their timeout or a shutdown.

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

`apply()` replaces `protocol_send` with one that handles those two events in a shielded
cancel scope, and leaves every other event to the original. It only patches the exact
code it was written for (Hypercorn 0.18.0's method, identified by a hash of its source):
any other version is left alone, with a log line, so a fixed or reworked Hypercorn is
never patched blindly.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
from importlib import metadata
from typing import Any

import trio

log = logging.getLogger("ovtrio")

# sha256 of inspect.getsource(hypercorn.trio.tcp_server.TCPServer.protocol_send) in
# Hypercorn 0.18.0, the code whose Closed branch runs unshielded.
PATCHED_SOURCE_SHA256 = "225856426bff7be02990c0badb90f51f801db14ac5db0f3d0c210cafbeb528ab"

_applied = False


def apply() -> bool:
    """Patch Hypercorn's trio TCPServer once per process; True if it is patched."""
    global _applied
    if _applied:
        return True
    from hypercorn.events import Closed, Updated
    from hypercorn.trio.tcp_server import TCPServer

    original = TCPServer.protocol_send
    source = inspect.getsource(original)
    if hashlib.sha256(source.encode()).hexdigest() != PATCHED_SOURCE_SHA256:
        log.info(
            "hypercorn %s: its trio TCPServer.protocol_send is not the code ovtrio's connection-close fix"
            " was written for; leaving it unpatched",
            metadata.version("hypercorn"),
        )
        return False

    async def protocol_send(self: Any, event: Any) -> None:
        if isinstance(event, Closed):
            # The sending task may already be cancelled: close the socket regardless.
            with trio.CancelScope(shield=True):
                await self._close()
            await self.protocol.handle(Closed())
        elif isinstance(event, Updated) and event.idle:
            # Starting the idle timer is one nursery.start: it ends at once, shielded.
            with trio.CancelScope(shield=True):
                await original(self, event)
        else:
            await original(self, event)

    protocol_send.__doc__ = original.__doc__
    TCPServer.protocol_send = protocol_send
    _applied = True
    return True
