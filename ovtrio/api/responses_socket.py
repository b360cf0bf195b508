"""OpenAI's Responses WebSocket mode on /v1/responses and /v3/responses.

The client sends JSON text frames {"type": "response.create", ...fields of POST
/v1/responses}; every response streams back as the same `response.*` events as over
SSE, as text frames. Several responses may run at once on one socket: a `stream_id` on
response.create is carried on every event of that response. Anything wrong with a
frame is an `error` event, and the socket stays usable.

Each response is a task of the connection's nursery, so closing the socket cancels
every one of them, and with them their engine requests. Responses are also kept in a
store that lives as long as the connection, so previous_response_id chains work with
store=false too. Events go through one bounded channel to the single writer: a slow
reader holds back the responses (their deltas wait, merged, in the scheduler) instead
of growing a buffer here.
"""

from __future__ import annotations

import json
import math
from functools import partial
from typing import Any

import trio
from pydantic import ValidationError
from quart import Blueprint, current_app, websocket

from ovtrio.api.errors import APIError, from_validation_error
from ovtrio.api.generation import generation_request, ready_service
from ovtrio.api.responses import prepare, response_events, store_response
from ovtrio.api.responses_protocol import ResponsesRequest
from ovtrio.response_store import ResponseStore
from ovtrio.scheduler import UnsupportedParams
from ovtrio.service import ModelService

blueprint = Blueprint("responses_socket", __name__)

MAX_FRAME_BYTES = 4 * 1024 * 1024
# Events waiting for the writer; beyond this the responses producing them wait.
OUTGOING_EVENTS = 256
CONNECTION_RESPONSES = 100
# Responses one socket may have running at once.
MAX_IN_FLIGHT = 16


def error_event(error: APIError, stream_id: Any = None) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": "error",
        "code": error.code or error.type,
        "message": error.message,
        "param": error.param,
        "sequence_number": 0,
    }
    if stream_id is not None:
        event["stream_id"] = stream_id
    return event


@blueprint.websocket("/v3/responses")
@blueprint.websocket("/v1/responses")
async def responses_socket() -> None:
    await websocket.accept()
    service: ModelService = current_app.config["OVTRIO_SERVICE"]
    local = ResponseStore(CONNECTION_RESPONSES, math.inf)
    send, receive = trio.open_memory_channel[dict[str, Any]](OUTGOING_EVENTS)
    in_flight: set[Any] = set()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_write, receive)
        while True:
            frame = await websocket.receive()
            request = _read_frame(frame)
            if isinstance(request, APIError):
                await send.send(error_event(request))
                continue
            stream_id, body = request
            if len(in_flight) >= MAX_IN_FLIGHT:
                busy = APIError(
                    429, f"At most {MAX_IN_FLIGHT} responses may run at once on one socket.", code="too_many_responses"
                )
                await send.send(error_event(busy, stream_id))
                continue
            try:
                runnable = await _runnable(service, body, local)
            except APIError as error:
                await send.send(error_event(error, stream_id))
                continue
            token = object()
            in_flight.add(token)
            nursery.start_soon(_run, service, runnable, local, stream_id, send.clone(), partial(in_flight.discard, token))


async def _write(receive: trio.MemoryReceiveChannel[dict[str, Any]]) -> None:
    async with receive:
        async for event in receive:
            await websocket.send(json.dumps(event, ensure_ascii=False, separators=(",", ":")))


def _read_frame(frame: str | bytes) -> APIError | tuple[Any, ResponsesRequest]:
    if len(frame) > MAX_FRAME_BYTES:
        return APIError(400, f"Frames may be at most {MAX_FRAME_BYTES} bytes.", code="frame_too_large")
    try:
        message = json.loads(frame)
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
    except ValidationError as exc:
        return from_validation_error(exc)
    except APIError as error:
        return error


async def _runnable(service: ModelService, body: ResponsesRequest, local: ResponseStore) -> Any:
    ready_service()
    ready = await prepare(service, body, local, service.responses)
    return ready, generation_request(service, body, [ready.prompt_ids], ready.markers)


async def _run(
    service: ModelService,
    runnable: Any,
    local: ResponseStore,
    stream_id: Any,
    send: trio.MemorySendChannel[dict[str, Any]],
    done: Any,
) -> None:
    ready, generation = runnable

    async def keep(response: dict[str, Any]) -> None:
        await store_response(local, ready, response)
        if ready.body.store:
            await store_response(service.responses, ready, response)

    async with send:
        assert service.scheduler is not None
        try:
            async with service.scheduler.submit(generation) as stream:
                async for events in response_events(ready.envelope, keep, stream, ready.formatter):
                    for event in events:
                        if stream_id is not None:
                            event["stream_id"] = stream_id
                        await send.send(event)
        except UnsupportedParams as exc:
            await send.send(error_event(APIError(400, str(exc), param=None, code="invalid_value"), stream_id))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the socket is gone; leaving the with-block cancelled the engine request
        finally:
            done()


