"""Server-sent events: where written bodies become bytes on a stream.

Chat and completion chunks go out as data-only events ending with `data: [DONE]`;
Responses events as named events (`event: response.created`), also ending with
`data: [DONE]`. EventStream is the response body of either.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from pydantic_core import to_json
from quart import Response

from ovtrio.api.compact_json import compact_json
from ovtrio.scheduler import RequestStream

HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
DONE = b"data: [DONE]\n\n"


def data_frame(body: dict[str, Any]) -> bytes:
    """A data-only event: one chat or completion chunk (or an error body)."""
    return b"data: " + compact_json(body).encode() + b"\n\n"


def named_frame(event: dict[str, Any]) -> bytes:
    """A named event: one `response.*` event, named by its type."""
    return f"event: {event['type']}\ndata: {compact_json(event)}\n\n".encode()


Frames = Callable[[RequestStream], AsyncIterator[bytes]]


class EventStream:
    """The SSE body of one streamed request.

    The request is submitted by `open()`, inside the handler, so that anything the
    engine refuses is still an ordinary HTTP error rather than a failure after the 200.
    Quart closes the body (`aclose`) however the response ends, including when the
    client disconnects and the sending task is cancelled; closing leaves the
    submission, and the scheduler cancels the engine request.
    """

    def __init__(self, submission: AbstractAsyncContextManager[RequestStream], frames: Frames) -> None:
        self._submission = submission
        self._frames = frames
        self._events: AsyncIterator[bytes] | None = None
        self._closed = False

    async def open(self) -> EventStream:
        """Submit the request; returns once the engine has it (or raises its refusal)."""
        self._events = self._frames(await self._submission.__aenter__())
        return self

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> bytes:
        assert self._events is not None, "EventStream.open() first"
        return await self._events.__anext__()

    async def aclose(self) -> None:
        if self._closed or self._events is None:
            return
        self._closed = True
        try:
            await self._events.aclose()  # type: ignore[attr-defined]
        finally:
            await self._submission.__aexit__(None, None, None)


def sse_response(body: EventStream) -> Response:
    return Response(body, mimetype="text/event-stream", headers=HEADERS)


def joined(frame: Callable[[dict[str, Any]], bytes], bodies: list[dict[str, Any]]) -> bytes:
    return b"".join(frame(body) for body in bodies)


def typed_frame(event: Any) -> bytes:
    """A named event from a typed one (a dataclass with a `type`: Responses and Messages
    events), written by pydantic's serializer."""
    return b"event: " + event.type.encode() + b"\ndata: " + to_json(event) + b"\n\n"
