"""POST /v1/responses and /v3/responses, unary and streamed, and the stored responses
(GET and DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items).

A response runs through the chat pipeline (chat template, tools, structured output,
reasoning and tool-call parsing); its output events are then laid out as `response.*`
events (events.py), streamed, or ending in the Response a unary request is answered
with (running.py).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from pydantic_core import to_jsonable_python
from quart import Blueprint, request

from ovtrio.api.context import response_store
from ovtrio.api.errors import invalid
from ovtrio.api.generation import accept, submitted
from ovtrio.api.responses.events import ResponseEvents
from ovtrio.api.responses.input_items import listed_item
from ovtrio.api.responses.prepare import not_found, prepare
from ovtrio.api.responses.protocol import ResponsesRequest
from ovtrio.api.responses.running import response_events, unary_response
from ovtrio.api.responses.store import StoredResponse
from ovtrio.api.sse import DONE, EventStream, sse_response, typed_frame
from ovtrio.scheduler import RequestStream

blueprint = Blueprint("responses", __name__)


@blueprint.post("/v3/responses")
@blueprint.post("/v1/responses")
async def create_response() -> Any:
    body, model = await accept(ResponsesRequest)
    store = response_store()
    ready = await prepare(model, body, store)
    stores = [store] if body.store else []
    if not body.stream:
        return to_jsonable_python(await unary_response(model.scheduler, ready, stores))

    async def frames(stream: RequestStream) -> AsyncGenerator[bytes, None]:
        writer = ResponseEvents(ready.envelope)
        async for events in response_events(stream, ready, writer, stores):
            yield b"".join(map(typed_frame, events))
        yield DONE

    return sse_response(await EventStream(submitted(model.scheduler, ready.generation), frames).open())


async def _stored(response_id: str) -> StoredResponse:
    entry = await response_store().get(response_id)
    if entry is None:
        raise not_found(response_id)
    return entry


@blueprint.get("/v3/responses/<response_id>")
@blueprint.get("/v1/responses/<response_id>")
async def retrieve_response(response_id: str) -> Any:
    return (await _stored(response_id)).response


@blueprint.delete("/v3/responses/<response_id>")
@blueprint.delete("/v1/responses/<response_id>")
async def delete_response(response_id: str) -> Any:
    if not await response_store().delete(response_id):
        raise not_found(response_id)
    return {"id": response_id, "object": "response", "deleted": True}


@blueprint.get("/v3/responses/<response_id>/input_items")
@blueprint.get("/v1/responses/<response_id>/input_items")
async def list_input_items(response_id: str) -> Any:
    """A page of the input items, as OpenAI lists them (input_items.py): `limit` 1-100
    (default 20), `order` asc or desc (default desc), after the item `after`."""
    limit, order, after = _page_arguments()
    items = (await _stored(response_id)).input_items
    ordered = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            raise invalid(f"Invalid value for 'after': no input item '{after}' in this response.", "after")
        ordered = ordered[ids.index(after) + 1 :]
    page = ordered[:limit]
    return {
        "object": "list",
        "data": [listed_item(item) for item in page],
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(ordered) > limit,
    }


MAX_PAGE = 100


def _page_arguments() -> tuple[int, str, str | None]:
    raw_limit = request.args.get("limit", "20")
    try:
        limit = int(raw_limit)
    except ValueError:
        raise invalid(
            f"Invalid type for 'limit': expected an integer, got '{raw_limit[:40]}'.", "limit", "invalid_type"
        ) from None
    if not 1 <= limit <= MAX_PAGE:
        raise invalid(f"Invalid value for 'limit': must be between 1 and {MAX_PAGE}, got {limit}.", "limit")
    order = request.args.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid(f"Invalid value for 'order': must be 'asc' or 'desc', got '{order[:40]}'.", "order")
    return limit, order, request.args.get("after")
