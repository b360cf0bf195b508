"""Running a prepared Messages request: to its end for a unary reply, or as a stream of
named server-sent events (`event: message_start` / `data: {...}`).

A stream answers 200 at once with `message_start`, before the scheduler has taken the
request: a request that waits in the queue sends a `ping` event every PING_INTERVAL
seconds meanwhile (and so does a stream with nothing to say for that long), which keeps
proxies and clients from timing out, as Anthropic's API does. Anything that fails after
that (the engine refusing the request as it is added, a failure while it runs) is an
`error` event. The stream has no `[DONE]`: `message_stop` ends it.

The request runs in a task of the stream's own nursery (trio.as_safe_channel), entered
when the first event is sent and left when Quart closes the body, however the response
ends: a client that disconnects cancels the task, and leaving the submission cancels
the engine request.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from contextlib import AbstractAsyncContextManager

import trio

from ovtrio.api.errors import api_error
from ovtrio.api.generation import run_to_end, submitted
from ovtrio.api.messages.errors import error_event
from ovtrio.api.messages.objects import Message, Ping
from ovtrio.api.messages.prepare import PreparedMessage
from ovtrio.api.messages.writer import MessageWriter
from ovtrio.api.sse import typed_frame
from ovtrio.scheduler import GenerationScheduler

PING_INTERVAL = 5.0
PING = typed_frame(Ping())


async def unary_message(scheduler: GenerationScheduler, ready: PreparedMessage, writer: MessageWriter) -> Message:
    """Run the request to its end; the Message its events add up to."""
    await run_to_end(scheduler, ready.generation, ready.stage, writer.write)
    return writer.message


async def _produce(
    scheduler: GenerationScheduler, ready: PreparedMessage, writer: MessageWriter, send: trio.MemorySendChannel[bytes]
) -> None:
    """The request's events, framed, into `send`; never raises (a failure is an event)."""
    async with send:
        try:
            async with submitted(scheduler, ready.generation) as stream:
                while outputs := await stream.receive_available():
                    if bodies := writer.write(ready.stage.feed(outputs)):
                        await send.send(b"".join(map(typed_frame, bodies)))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return  # the client is gone; leaving the submission cancelled the engine request
        except Exception as error:  # noqa: BLE001 (whatever fails, the client hears of it as an event)
            try:
                await send.send(typed_frame(error_event(api_error(error))))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass


@trio.as_safe_channel
async def _frames(
    scheduler: GenerationScheduler, ready: PreparedMessage, writer: MessageWriter, interval: float
) -> AsyncGenerator[bytes, None]:
    yield b"".join(map(typed_frame, writer.opening()))
    send, receive = trio.open_memory_channel[bytes](0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_produce, scheduler, ready, writer, send)
        with receive:
            while True:
                frames = b""
                with trio.move_on_after(interval):
                    try:
                        frames = await receive.receive()
                    except trio.EndOfChannel:
                        return
                yield frames or PING


class MessageStream:
    """The SSE body of a streamed message (see the module's docstring). Quart iterates
    it and closes it (`aclose`) in the same task, so the nursery it opens on the first
    event is entered and left there."""

    def __init__(self, channel: Callable[[], AbstractAsyncContextManager[trio.abc.ReceiveChannel[bytes]]]) -> None:
        self._open = channel
        self._context: AbstractAsyncContextManager[trio.abc.ReceiveChannel[bytes]] | None = None
        self._channel: trio.abc.ReceiveChannel[bytes] | None = None
        self._closed = False

    @classmethod
    def of(
        cls,
        scheduler: GenerationScheduler,
        ready: PreparedMessage,
        writer: MessageWriter,
        interval: float = PING_INTERVAL,
    ) -> MessageStream:
        return cls(lambda: _frames(scheduler, ready, writer, interval))

    def __aiter__(self) -> MessageStream:
        return self

    async def __anext__(self) -> bytes:
        if self._closed:
            raise StopAsyncIteration
        if self._channel is None:
            self._context = self._open()
            self._channel = await self._context.__aenter__()
        try:
            return await self._channel.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        self._closed = True
        context, self._context = self._context, None
        if context is not None:
            await context.__aexit__(None, None, None)
