"""OpenAI's Responses WebSocket mode on /v1/responses and /v3/responses.

The client sends JSON text frames {"type": "response.create", ...fields of POST
/v1/responses}; every response streams back as the same `response.*` events as over
SSE, as text frames. Several responses may run at once on one socket: a `stream_id` on
response.create is carried on every event of that response. Anything wrong with a
frame is an `error` event, and the socket stays usable; so is a server too busy to take
a response on (code `rate_limit_exceeded`, the WebSocket form of HTTP's 429).

A message over `websocket_max_message_bytes` is dropped as it arrives, unread and
unkept (ovtrio/server/hypercorn_patches/websocket_message_size.py), and answered with an `error` event (code
frame_too_large); the socket stays usable. A socket with no message from the client
for `websocket_idle_timeout` seconds while none of its responses runs is closed with
code 1000 and a reason saying so.

Each response is a task of the connection's nursery, so closing the socket cancels
every one of them, and with them their engine requests. Responses are also kept in a
store that lives as long as the connection, so previous_response_id chains work with
store=false too. Events go through one bounded channel to the single writer: a slow
reader holds back the responses (their deltas wait, merged, in the scheduler) instead
of growing a buffer here.

When the server shuts down (ovtrio/serving/shutdown.py), response.create frames are refused
with an `error` event while the running responses go on; once the drain is over (they
finished, or were cut with `response.failed`), the socket sends an `error` event with
code server_shutting_down and closes with 1001 (going away).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import h11
import trio
from pydantic import ValidationError
from pydantic_core import from_json, to_json, to_jsonable_python
from quart import Blueprint, websocket

from ovtrio.api import leases
from ovtrio.api.auth import offered_subprotocols, socket_subprotocol
from ovtrio.api.context import generation_model, model_registry, response_store, socket_limits
from ovtrio.api.errors import REQUEST_ERRORS, APIError, api_error, shutting_down
from ovtrio.api.generation import submitted
from ovtrio.api.lifted_strings import lift_data_urls
from ovtrio.api.responses.events import ResponseEvents
from ovtrio.api.responses.oversized_message import OversizedMessage
from ovtrio.api.responses.prepare import PreparedResponse, prepare
from ovtrio.api.responses.protocol import ResponsesRequest
from ovtrio.api.responses.running import response_events
from ovtrio.api.responses.store import ResponseStore
from ovtrio.scheduler import GenerationScheduler
from ovtrio.serving import memory

log = logging.getLogger("ovtrio")

blueprint = Blueprint("responses_socket", __name__)

# Events waiting for the writer; beyond this the responses producing them wait.
OUTGOING_EVENTS = 256
CONNECTION_RESPONSES = 100
CONNECTION_RESPONSE_BYTES = 16 * 1024 * 1024
# Responses one socket may have running at once.
MAX_IN_FLIGHT = 16


@blueprint.websocket("/v3/responses")
@blueprint.websocket("/v1/responses")
async def responses_socket() -> None:
    try:
        await websocket.accept(subprotocol=socket_subprotocol(offered_subprotocols(websocket.headers)))
    except h11.LocalProtocolError as exc:
        # A handshake HTTP cannot upgrade (one with a body: Hypercorn has already answered
        # it 400 and closes the connection). The client's doing: one line, no traceback.
        log.warning("refused a WebSocket handshake that cannot be upgraded: %s", exc)
        return
    limits = socket_limits()
    idle = IdleClock(limits.idle_timeout)
    send, receive = trio.open_memory_channel[str](OUTGOING_EVENTS)
    async with trio.open_nursery() as connection:
        connection.start_soon(_write, receive)
        async with send:  # closed once the responses are over, so the writer ends
            async with trio.open_nursery() as responses:
                with trio.CancelScope() as reading:
                    responses.start_soon(_stop_at_end_of_drain, reading)
                    await _serve_frames(responses, send, limits.max_message_bytes, idle)
                # Reading stops here only when the socket was idle too long (no response
                # runs then: what is left is the drain's watch) or the server's drain has
                # ended (a client that leaves cancels everything instead).
                if idle.expired:
                    responses.cancel_scope.cancel()
            if not idle.expired:
                # This socket's responses have finished or been cut by now: say why the
                # socket closes, then close it.
                await send.send(frame_text(shutting_down().event()))
    if idle.expired:
        await websocket.close(1000, f"idle for {limits.idle_timeout:g} s")
    else:
        await websocket.close(1001, "server shutting down")


class IdleClock:
    """Whether a socket has been idle for `seconds`: no message from the client, and no
    response running. The time counts from the last message or the end of the last
    response, whichever came later, and only while the socket waits for a message."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.running = 0  # the socket's responses running now
        self.expired = False
        self._idle_since = trio.current_time()
        self._waiting = trio.CancelScope()

    async def receive(self, receive: Callable[[], Awaitable[str | bytes]]) -> str | bytes | None:
        """The client's next message (from `receive`), or None once the socket has been
        idle too long."""
        with trio.CancelScope(deadline=self._deadline()) as self._waiting:
            message = await receive()
            self._idle_since = trio.current_time()
            return message
        self.expired = True
        return None

    def response_started(self) -> None:
        self.running += 1
        self._waiting.deadline = self._deadline()

    def response_ended(self) -> None:
        self.running -= 1
        self._idle_since = trio.current_time()
        self._waiting.deadline = self._deadline()

    def _deadline(self) -> float:
        return math.inf if self.running else self._idle_since + self.seconds


async def _stop_at_end_of_drain(reading: trio.CancelScope) -> None:
    """While the server drains, the socket stays open for the responses running on it
    (new ones are refused); once the drain is over there is nothing left to wait for."""
    await model_registry().shutdown.drained.wait()
    reading.cancel()


async def _serve_frames(
    responses: trio.Nursery, send: trio.MemorySendChannel[str], max_bytes: int, idle: IdleClock
) -> None:
    """Read response.create frames until the socket is idle too long, each response a
    task of `responses`."""
    local = ResponseStore(CONNECTION_RESPONSES, math.inf, max_bytes=CONNECTION_RESPONSE_BYTES)
    while True:
        frame = await idle.receive(websocket.receive)
        if frame is None:
            return
        try:
            request = await _read_frame(frame, max_bytes)
        except Exception as error:  # noqa: BLE001 - whatever a frame does, the socket stays usable
            request = api_error(error)
        if isinstance(request, APIError):
            await send.send(frame_text(request.event()))
            continue
        stream_id, body = request
        if idle.running >= MAX_IN_FLIGHT:
            busy = APIError(
                429, f"At most {MAX_IN_FLIGHT} responses may run at once on one socket.", code="too_many_responses"
            )
            await send.send(frame_text(busy.event(stream_id)))
            continue
        await _start_response(responses, send, local, idle, stream_id, body)


async def _start_response(
    responses: trio.Nursery,
    send: trio.MemorySendChannel[str],
    local: ResponseStore,
    idle: IdleClock,
    stream_id: Any,
    body: ResponsesRequest,
) -> None:
    """Prepare one response.create's response and start it as a task of `responses`, or
    send the error event that says why it cannot run. A function of its own so that what
    it holds of the model (its engine) goes with it: kept in the reading loop, it would
    stay for as long as the socket waits for its next frame, an unloaded model's
    engine with it."""
    # The response's lease on its model is its own, given back when it ends (leases.py).
    with leases.separate() as held:
        try:
            model = await generation_model(body.model, body.keep_alive)
            model.scheduler.check_capacity()
            ready = await prepare(model, body, local, response_store())
        except REQUEST_ERRORS as error:
            held.release()
            await send.send(frame_text(api_error(error).event(stream_id)))
            return
        except BaseException:
            held.release()
            raise

    def ended() -> None:
        held.release()
        idle.response_ended()

    # Every response stays on the socket for chaining; stored ones also server-wide.
    stores = [local, response_store()] if body.store else [local]
    idle.response_started()
    responses.start_soon(_run, model.scheduler, ready, stores, stream_id, send.clone(), ended)


def frame_text(event: Any, stream_id: Any = None) -> str:
    """An event (typed, or an error's dict) as a text frame, with the stream_id of the
    response it belongs to when it has one."""
    if stream_id is not None:
        event = {**to_jsonable_python(event), "stream_id": stream_id}
    return to_json(event).decode()


async def _write(receive: trio.MemoryReceiveChannel[str]) -> None:
    async with receive:
        async for text in receive:
            await websocket.send(text)


async def _read_frame(frame: str | bytes, max_bytes: int) -> APIError | tuple[Any, ResponsesRequest]:
    if isinstance(frame, OversizedMessage) or len(frame) > max_bytes:  # the latter if Hypercorn's own buffer runs
        size = frame.length if isinstance(frame, OversizedMessage) else len(frame)
        return APIError(
            400,
            f"The message is {size} bytes long; messages may be at most {max_bytes} bytes"
            " (--websocket-max-message-bytes).",
            code="frame_too_large",
        )
    try:
        # pydantic's parser, as for HTTP bodies: nesting beyond its depth limit is a
        # ValueError here, where json.loads would raise RecursionError. Its images'
        # data URLs are lifted out first, as they are from HTTP bodies.
        memory.note_request_size(len(frame))
        lifted = await lift_data_urls(frame)
        message = from_json(lifted.json)
    except ValueError:
        return APIError(400, "The frame is not valid JSON.", code="invalid_json")
    if not isinstance(message, dict):
        return APIError(400, "The frame must be a JSON object.", code="invalid_json")
    kind = message.pop("type", None)
    if kind != "response.create":
        return APIError(400, f"Unknown event type {kind!r}; send response.create.", param="type", code="unknown_event")
    stream_id = message.pop("stream_id", None)
    message.pop("stream", None)
    message.pop("background", None)
    # The strings go back before validation (of Python objects here, as cheap with them as
    # without): each is checked as its field checks any string.
    lifted.restore(message)
    try:
        body = ResponsesRequest.model_validate({**message, "stream": True})
    except (ValidationError, APIError) as error:
        return api_error(error)
    return stream_id, body


async def _run(
    scheduler: GenerationScheduler,
    ready: PreparedResponse,
    stores: list[ResponseStore],
    stream_id: Any,
    send: trio.MemorySendChannel[str],
    done: Callable[[], None],
) -> None:
    async with send:
        try:
            async with submitted(scheduler, ready.generation) as stream:
                writer = ResponseEvents(ready.envelope)
                async for events in response_events(stream, ready, writer, stores):
                    for event in events:
                        await send.send(frame_text(event, stream_id))
        except REQUEST_ERRORS as error:  # refused as the request was submitted (overloaded) or added
            await send.send(frame_text(api_error(error).event(stream_id)))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the socket is gone; leaving the with-block cancelled the engine request
        finally:
            done()
