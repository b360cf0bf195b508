"""What the app receives in place of a Responses WebSocket message over the size limit
(the Hypercorn patch in ovtrio/server/hypercorn_patches/websocket_message_size.py drops
the message unread and hands this on, so the socket can answer with an error event)."""

from __future__ import annotations


class OversizedMessage(str):
    """Stands for a message longer than the limit, which was dropped: `length` is its
    size in bytes (at least; counting stops at the limit plus one received chunk)."""

    length: int

    def __new__(cls, length: int) -> OversizedMessage:
        message = super().__new__(cls, "")
        message.length = length
        return message
