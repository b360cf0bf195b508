"""Running a prepared Messages request: to its end for a unary reply, or as a stream of
named server-sent events (`event: message_start` / `data: {...}`).

A stream answers 200 at once with `message_start`, before the scheduler has taken the
request: a request that waits in the queue sends a `ping` event every PING_INTERVAL
seconds meanwhile (and so does a stream with nothing to say for that long), which keeps
proxies and clients from timing out, as Anthropic's API does. Anything that fails after
that (the engine refusing the request as it is added, a failure while it runs) is an
`error` event. The stream has no `[DONE]`: `message_stop` ends it. The body is the
driver every streamed endpoint uses (EventStream, api/sse.py), told to answer at once.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from ovtrio.api.errors import api_error
from ovtrio.api.generation import run_to_end, submitted
from ovtrio.api.messages.errors import error_event
from ovtrio.api.messages.objects import Message, Ping
from ovtrio.api.messages.prepare import PreparedMessage
from ovtrio.api.messages.writer import MessageWriter
from ovtrio.api.sse import AnswerAtOnce, EventStream, typed_frame
from ovtrio.scheduler import GenerationScheduler, RequestStream

PING_INTERVAL = 5.0
PING = typed_frame(Ping())


async def unary_message(scheduler: GenerationScheduler, ready: PreparedMessage, writer: MessageWriter) -> Message:
    """Run the request to its end; the Message its events add up to."""
    await run_to_end(scheduler, ready.generation, ready.stage, writer.write)
    return writer.message


def _error_frame(error: Exception) -> bytes:
    return typed_frame(error_event(api_error(error)))


def message_stream(
    scheduler: GenerationScheduler,
    ready: PreparedMessage,
    writer: MessageWriter,
    interval: float = PING_INTERVAL,
) -> EventStream:
    """The SSE body of a streamed message (see the module's docstring)."""

    async def frames(stream: RequestStream) -> AsyncGenerator[bytes, None]:
        while outputs := await stream.receive_available():
            if bodies := writer.write(ready.stage.feed(outputs)):
                yield b"".join(map(typed_frame, bodies))

    opening = b"".join(map(typed_frame, writer.opening()))
    at_once = AnswerAtOnce(opening, PING, interval, _error_frame)
    return EventStream(submitted(scheduler, ready.generation), frames, at_once)
