"""Server-sent events: where written bodies become bytes on a stream, and the one driver
every streamed endpoint answers with (EventStream).

Chat and completion chunks go out as data-only events ending with `data: [DONE]`;
Responses events as named events (`event: response.created`), also ending with
`data: [DONE]`; Anthropic Messages events as named events with no `[DONE]`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from contextlib import AbstractAsyncContextManager, aclosing
from dataclasses import dataclass
from typing import Any

import trio
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


Frames = Callable[[RequestStream], AsyncGenerator[bytes, None]]
Submission = AbstractAsyncContextManager[RequestStream]


@dataclass(frozen=True, slots=True)
class AnswerAtOnce:
    """How a stream that answers 200 before its request is submitted keeps the client
    informed: `opening` goes out at once, `ping` whenever nothing else has for
    `interval` seconds (while the request waits in the queue, or runs with nothing to
    say), and an exception raised after the 200 (the engine refusing the request as it
    is added included) becomes the frame `failure` makes of it, which ends the stream."""

    opening: bytes
    ping: bytes
    interval: float
    failure: Callable[[Exception], bytes]


class EventStream:
    """The SSE body of one streamed request, whichever endpoint it answers.

    By default the request is submitted by `open()`, inside the handler, so that anything
    the engine refuses is still an ordinary HTTP error rather than a failure after the
    200; Quart pulls each frame as it sends the last, and an exception raised after the
    200 ends the body with it (the connection closes).

    With `at_once` (AnswerAtOnce), the stream answers first and submits when its opening
    has gone out. Its frames are then made by a task of the body's own nursery and
    handed over one at a time (a channel without a buffer, so a client that does not
    read holds its request back as it would pulling the frames itself), which is what
    lets the body send pings while it waits for them; a stream that sends no pings
    spares each frame that task switch. The nursery is opened by the first frame after
    the opening and left by `aclose`: Quart iterates and closes the body in one task.

    Quart closes the body (`aclose`) however the response ends, including when the
    client disconnects and the sending task is cancelled; closing leaves the submission,
    and the scheduler cancels the engine request.
    """

    def __init__(self, submission: Submission, frames: Frames, at_once: AnswerAtOnce | None = None) -> None:
        self._submission = submission
        self._frames = frames
        self._at_once = at_once
        self._entered = False  # the submission, entered and not yet left
        self._events: AsyncGenerator[bytes, None] | None = None  # pulled by Quart (no pings)
        self._answered = False  # the opening of a stream that answers at once has gone out
        self._nursery_context: AbstractAsyncContextManager[trio.Nursery] | None = None
        self._nursery: trio.Nursery | None = None
        self._receive: trio.MemoryReceiveChannel[bytes | Exception] | None = None
        self._closed = False

    async def open(self) -> EventStream:
        """Submit the request, unless the stream answers at once; returns once the engine
        has it (or raises its refusal)."""
        if self._at_once is None:
            self._events = self._frames(await self._submission.__aenter__())
            self._entered = True
        return self

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> bytes:
        if self._closed:
            raise StopAsyncIteration
        if self._at_once is None:
            assert self._events is not None, "EventStream.open() first"
            return await self._events.__anext__()
        if not self._answered:
            self._answered = True
            return self._at_once.opening
        if self._receive is None:
            await self._start()
        with trio.move_on_after(self._at_once.interval):
            return await self._handed_over(self._at_once)
        return self._at_once.ping

    async def _handed_over(self, at_once: AnswerAtOnce) -> bytes:
        """The next frame the task made: its failure made a frame, its end the body's."""
        assert self._receive is not None
        try:
            frame = await self._receive.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
        return at_once.failure(frame) if isinstance(frame, Exception) else frame

    async def _start(self) -> None:
        send, self._receive = trio.open_memory_channel[bytes | Exception](0)
        self._nursery_context = trio.open_nursery()
        self._nursery = await self._nursery_context.__aenter__()
        self._nursery.start_soon(self._produce, send)

    async def _produce(self, send: trio.MemorySendChannel[bytes | Exception]) -> None:
        """Submit, then the request's frames into `send`, then the exception that ended
        them if any; never raises."""
        async with send:
            try:
                async with self._submission as stream, aclosing(self._frames(stream)) as frames:
                    async for frame in frames:
                        await send.send(frame)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return  # the body is closed: the client is gone
            except Exception as error:  # noqa: BLE001 (whatever fails, the client hears of it as a frame)
                try:
                    await send.send(error)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._events is not None:
                await self._events.aclose()
            if self._nursery is not None and self._nursery_context is not None:
                self._nursery.cancel_scope.cancel()
                await self._nursery_context.__aexit__(None, None, None)
            if self._receive is not None:
                self._receive.close()
        finally:
            if self._entered:
                await self._submission.__aexit__(None, None, None)


def sse_response(body: EventStream) -> Response:
    return Response(body, mimetype="text/event-stream", headers=HEADERS)


def joined(frame: Callable[[dict[str, Any]], bytes], bodies: list[dict[str, Any]]) -> bytes:
    return b"".join(frame(body) for body in bodies)


def typed_frame(event: Any) -> bytes:
    """A named event from a typed one (a dataclass with a `type`: Responses and Messages
    events), written by pydantic's serializer."""
    return b"event: " + event.type.encode() + b"\ndata: " + to_json(event) + b"\n\n"
