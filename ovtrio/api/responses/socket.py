"""OpenAI's Responses WebSocket mode on /v1/responses and /v3/responses.

The client sends JSON text frames {"type": "response.create", ...fields of POST
/v1/responses}; every response streams back as the same `response.*` events as over
SSE, as text frames. Several responses may run at once on one socket: a `stream_id` on
response.create is carried on every event of that response. Anything wrong with a
frame is an `error` event, and the socket stays usable; so is a server too busy to take
a response on (code `rate_limit_exceeded`, the WebSocket form of HTTP's 429).

Each response is a task of the connection's nursery, so closing the socket cancels
every one of them, and with them their engine requests. Responses are also kept in a
store that lives as long as the connection, so previous_response_id chains work with
store=false too. Events go through one bounded channel to the single writer: a slow
reader holds back the responses (their deltas wait, merged, in the scheduler) instead
of growing a buffer here.

When the server shuts down (ovtrio/shutdown.py), response.create frames are refused
with an `error` event while the running responses go on; once the drain is over (they
finished, or were cut with `response.failed`), the socket sends an `error` event with
code server_shutting_down and closes with 1001 (going away).
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio
from pydantic import ValidationError
from pydantic_core import from_json
from quart import Blueprint, websocket

from ovtrio.api.auth import offered_subprotocols, socket_subprotocol
from ovtrio.api.context import generation_model, model_registry, response_store
from ovtrio.api.errors import REQUEST_ERRORS, APIError, api_error, shutting_down
from ovtrio.api.pipeline import submitted, written
from ovtrio.api.responses.events import ResponseEvents
from ovtrio.api.responses.prepare import PreparedResponse, prepare, store_response
from ovtrio.api.responses.protocol import ResponsesRequest
from ovtrio.api.responses.store import ResponseStore
from ovtrio.scheduler import GenerationScheduler

blueprint = Blueprint("responses_socket", __name__)

MAX_FRAME_BYTES = 4 * 1024 * 1024
# Events waiting for the writer; beyond this the responses producing them wait.
OUTGOING_EVENTS = 256
CONNECTION_RESPONSES = 100
# Responses one socket may have running at once.
MAX_IN_FLIGHT = 16


@blueprint.websocket("/v3/responses")
@blueprint.websocket("/v1/responses")
async def responses_socket() -> None:
    await websocket.accept(subprotocol=socket_subprotocol(offered_subprotocols(websocket.headers)))
    send, receive = trio.open_memory_channel[dict[str, Any]](OUTGOING_EVENTS)
    async with trio.open_nursery() as connection:
        connection.start_soon(_write, receive)
        async with send:  # closed once the responses are over, so the writer ends
            async with trio.open_nursery() as responses:
                with trio.CancelScope() as reading:
                    responses.start_soon(_stop_at_end_of_drain, reading)
                    await _serve_frames(responses, send)
            # Reading stops here only when the server's drain has ended (a client that
            # leaves cancels everything instead). This socket's responses have finished
            # or been cut by now: say why the socket closes, then close it.
            await send.send(shutting_down().event())
    await websocket.close(1001, "server shutting down")


async def _stop_at_end_of_drain(reading: trio.CancelScope) -> None:
    """While the server drains, the socket stays open for the responses running on it
    (new ones are refused); once the drain is over there is nothing left to wait for."""
    await model_registry().shutdown.drained.wait()
    reading.cancel()


async def _serve_frames(responses: trio.Nursery, send: trio.MemorySendChannel[dict[str, Any]]) -> None:
    """Read response.create frames for ever, each response a task of `responses`."""
    local = ResponseStore(CONNECTION_RESPONSES, math.inf)
    in_flight: set[Any] = set()
    while True:
        frame = await websocket.receive()
        try:
            request = _read_frame(frame)
        except Exception as error:  # whatever a frame does, the socket stays usable
            request = api_error(error)
        if isinstance(request, APIError):
            await send.send(request.event())
            continue
        stream_id, body = request
        if len(in_flight) >= MAX_IN_FLIGHT:
            busy = APIError(
                429, f"At most {MAX_IN_FLIGHT} responses may run at once on one socket.", code="too_many_responses"
            )
            await send.send(busy.event(stream_id))
            continue
        try:
            model = generation_model(body.model)
            model.scheduler.check_capacity()
            ready = await prepare(model, body, local, response_store())
        except REQUEST_ERRORS as error:
            await send.send(api_error(error).event(stream_id))
            continue
        keep = partial(_keep, ready, local, response_store())
        token = object()
        in_flight.add(token)
        done = partial(in_flight.discard, token)
        responses.start_soon(_run, model.scheduler, ready, keep, stream_id, send.clone(), done)


async def _write(receive: trio.MemoryReceiveChannel[dict[str, Any]]) -> None:
    async with receive:
        async for event in receive:
            await websocket.send(json.dumps(event, ensure_ascii=False, separators=(",", ":")))


def _read_frame(frame: str | bytes) -> APIError | tuple[Any, ResponsesRequest]:
    if len(frame) > MAX_FRAME_BYTES:
        return APIError(400, f"Frames may be at most {MAX_FRAME_BYTES} bytes.", code="frame_too_large")
    try:
        # pydantic's parser, as for HTTP bodies: nesting beyond its depth limit is a
        # ValueError here, where json.loads would raise RecursionError.
        message = from_json(frame)
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
    try:
        return stream_id, ResponsesRequest.model_validate({**message, "stream": True})
    except (ValidationError, APIError) as error:
        return api_error(error)


async def _keep(ready: PreparedResponse, local: ResponseStore, shared: ResponseStore, response: dict[str, Any]) -> None:
    """Every response stays on the socket for chaining; stored ones also server-wide."""
    await store_response(local, ready, response)
    if ready.body.store:
        await store_response(shared, ready, response)


async def _run(
    scheduler: GenerationScheduler,
    ready: PreparedResponse,
    keep: Callable[[dict[str, Any]], Awaitable[None]],
    stream_id: Any,
    send: trio.MemorySendChannel[dict[str, Any]],
    done: Callable[[], None],
) -> None:
    async with send:
        try:
            async with submitted(scheduler, ready.generation) as stream:
                writer, stored = ResponseEvents(ready.envelope), False
                async for events in written(stream, ready.stage, writer):
                    if writer.final is not None and not stored:  # stored before the client hears it ended
                        stored = True
                        await keep(writer.final)
                    for event in events:
                        if stream_id is not None:
                            event["stream_id"] = stream_id
                        await send.send(event)
        except REQUEST_ERRORS as error:  # refused as the request was submitted (overloaded) or added
            await send.send(api_error(error).event(stream_id))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the socket is gone; leaving the with-block cancelled the engine request
        finally:
            done()
