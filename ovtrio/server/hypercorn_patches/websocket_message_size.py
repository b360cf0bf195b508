"""Make an oversized WebSocket message something the app answers, not a closed socket.

Hypercorn gathers each WebSocket message (all of its frames) in a `WebsocketBuffer`
before it hands the message to the app. Past `websocket_max_message_size` (16 MiB by
default) the buffer raises, and the stream closes the socket with 1009 (message too
big) without ever telling the app, and without ending the TCP connection, which then
lingers while the client's frame goes on arriving. The Responses WebSocket promises an
`error` event for a bad message and a socket that stays usable.

`apply(limit)` puts a buffer of ovtrio's own in Hypercorn's place. It keeps at most
`limit` bytes of a message (UTF-8 bytes for text); beyond them it drops the rest of
the message as it arrives, so memory stays bounded whatever the client sends, and
when the message ends it hands the app an `OversizedMessage`, an empty string that
carries the message's length, instead of the message. The app answers it
(ovtrio/api/responses/socket.py) and the connection goes on. The limit is the
process's: the last app built sets it (a server serves one app).

As ovtrio/server/hypercorn_patches/connection_close.py does, it only replaces the exact code it was written for
(Hypercorn 0.18.0's buffer and the stream methods that use it, identified by hashes of
their source): with any other version Hypercorn's own limit stays, with a log line.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
from importlib import metadata
from io import BytesIO, StringIO
from typing import Any

from ovtrio.api.responses.oversized_message import OversizedMessage

log = logging.getLogger("ovtrio")

# sha256 of inspect.getsource() of WebsocketBuffer, WSStream._handle_events and
# WSStream.__init__ in Hypercorn 0.18.0: how the buffer is made, filled, read and reset.
PATCHED_SOURCE_SHA256 = (
    "31c9b1345f308f4c722d27e4e43b7deb638f21cd4296fcffd8a483d27c612517",
    "b90f3f595ff9fd4722f15769e9c40d113838a1deb6f3ecc0f63dc8ffc1d7f8e8",
    "3534d3ebe8f7a1a44877285b6ed6eba7c9544de85d1b402a4b0b7c2a6029ed99",
)

_limit: int | None = None


class BoundedMessageBuffer:
    """Hypercorn's WebsocketBuffer's interface, keeping at most the process's limit."""

    def __init__(self, max_length: int) -> None:
        # Hypercorn passes its config's websocket_max_message_size; ovtrio's setting rules.
        self.max_length = _limit if _limit is not None else max_length
        self.value: StringIO | BytesIO | None = None
        self.length = 0

    def extend(self, event: Any) -> None:
        from wsproto.events import TextMessage

        text = isinstance(event, TextMessage)
        size = len(event.data.encode()) if text else len(event.data)
        self.length += size
        if self.length > self.max_length:
            self.value = None  # what came so far goes too; the rest is counted, not kept
            return
        if self.value is None and self.length == size:
            self.value = StringIO() if text else BytesIO()
        if self.value is not None:
            self.value.write(event.data)

    def clear(self) -> None:
        self.value = None
        self.length = 0

    def to_message(self) -> dict[str, Any]:
        if self.length > self.max_length:
            return {"type": "websocket.receive", "bytes": None, "text": OversizedMessage(self.length)}
        if isinstance(self.value, BytesIO):
            return {"type": "websocket.receive", "bytes": self.value.getvalue(), "text": None}
        text = self.value.getvalue() if self.value is not None else ""
        return {"type": "websocket.receive", "bytes": None, "text": text}


def apply(limit: int) -> bool:
    """Bound every WebSocket message Hypercorn gathers from now on to `limit` bytes;
    True if ovtrio's buffer is in place."""
    global _limit
    from hypercorn.protocol import ws_stream

    _limit = limit
    if ws_stream.WebsocketBuffer is BoundedMessageBuffer:
        return True
    sources = (ws_stream.WebsocketBuffer, ws_stream.WSStream._handle_events, ws_stream.WSStream.__init__)
    digests = tuple(hashlib.sha256(inspect.getsource(code).encode()).hexdigest() for code in sources)
    if digests != PATCHED_SOURCE_SHA256:
        log.info(
            "hypercorn %s: its WebSocket message buffer is not the code ovtrio's message limit was written for;"
            " messages over its websocket_max_message_size close the socket",
            metadata.version("hypercorn"),
        )
        return False
    # The patch itself: a class of the same interface in place of Hypercorn's.
    ws_stream.WebsocketBuffer = BoundedMessageBuffer  # type: ignore[misc,assignment]
    return True
