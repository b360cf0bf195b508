"""POST /v1/responses and /v3/responses: the Responses API, unary and streamed.

A response runs through the chat pipeline (chat template, tools, structured output,
reasoning and tool-call parsing) and the chat result is then laid out as a Response
object: reasoning, message and function_call output items, usage with its details,
and the request's settings echoed back. Streamed, the chat deltas become `response.*`
events (response_events.py).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from quart import Blueprint, current_app

from ovtrio.api.errors import APIError
from ovtrio.api.formatting import ChatFormatter, Formatter
from ovtrio.api.generation import chat_formatter, check_model, encode_conversation, parse_body, ready_service, respond
from ovtrio.api.protocol import ChatMessage, NamedToolChoice
from ovtrio.api.response_events import ResponseEvents, sse
from ovtrio.api.responding import DONE_EVENT, chunk_bodies
from ovtrio.api.responses_protocol import ResponsesRequest
from ovtrio.response_store import ResponseStore, StoredResponse
from ovtrio.scheduler import RequestStream
from ovtrio.service import ModelService

blueprint = Blueprint("responses", __name__)


@dataclass
class PreparedResponse:
    """A Responses request made ready to run: its prompt, shaping and response envelope."""

    body: ResponsesRequest
    envelope: Callable[..., dict[str, Any]]
    prompt_ids: list[int]
    formatter: ChatFormatter
    markers: frozenset[int]
    previous: list[ChatMessage]


async def prepare(
    service: ModelService, body: ResponsesRequest, *stores: ResponseStore
) -> PreparedResponse:
    """Resolve previous_response_id (in `stores`, first match) and build the prompt."""
    check_model(service, body)
    previous: list[ChatMessage] = []
    if body.previous_response_id is not None:
        earlier = None
        for store in stores:
            if (earlier := await store.get(body.previous_response_id)) is not None:
                break
        if earlier is None:
            raise not_found(body.previous_response_id, "previous_response_id")
        previous = [ChatMessage.model_validate(m) for m in earlier.conversation]
    envelope = partial(response_envelope, body, _new_id("resp"), int(time.time()), service.model_name)
    prompt, tools = encode_conversation(service, body, body.chat_messages(previous))
    formatter, markers = chat_formatter(service, body, prompt, tools, body.n)
    formatter.include_usage = True  # the final event carries usage
    return PreparedResponse(body, envelope, prompt.ids, formatter, markers, previous)


@blueprint.post("/v3/responses")
@blueprint.post("/v1/responses")
async def create_response() -> Any:
    body: ResponsesRequest = await parse_body(ResponsesRequest)
    service = ready_service()
    ready = await prepare(service, body, service.responses)
    keep = partial(store_response, service.responses, ready) if body.store else None
    if body.stream:
        render = partial(_sse, ready.envelope, keep)
        return await respond(service, body, [ready.prompt_ids], ready.formatter, ready.markers, render=render)
    chat = await respond(service, body, [ready.prompt_ids], ready.formatter, ready.markers)
    incomplete = any(c["finish_reason"] == "length" for c in chat["choices"])
    output = [item for choice in chat["choices"] for item in output_items(choice)]
    response = ready.envelope("incomplete" if incomplete else "completed", output, chat["usage"], incomplete, None)
    if keep:
        await keep(response)
    return response


async def response_events(
    envelope: Any, keep: Callable[[dict[str, Any]], Awaitable[None]] | None, stream: RequestStream, formatter: Formatter
) -> AsyncIterator[list[dict[str, Any]]]:
    """The `response.*` events of one request, in batches as the engine produces them;
    `keep` gets the final response object."""
    writer = ResponseEvents(envelope)
    yield writer.start()
    while messages := await stream.receive_available():
        events = [event for chunk in chunk_bodies(formatter, messages) for event in writer.on_chunk(chunk)]
        if events and keep and events[-1]["type"] in ("response.completed", "response.incomplete"):
            await keep(events[-1]["response"])
        if events:
            yield events


async def _sse(
    envelope: Any, keep: Callable[[dict[str, Any]], Awaitable[None]] | None, stream: RequestStream, formatter: Formatter
) -> AsyncIterator[bytes]:
    async for events in response_events(envelope, keep, stream, formatter):
        yield b"".join(sse(event) for event in events)
    yield DONE_EVENT


async def store_response(store: ResponseStore, ready: PreparedResponse, response: dict[str, Any]) -> None:
    body, previous = ready.body, ready.previous
    current = body.input_messages()
    conversation = [m.model_dump(exclude_none=True) for m in [*previous, *current]] + _output_messages(response["output"])
    items = [
        {"id": item.id or _new_id("msg"), **item.model_dump(exclude_none=True, exclude={"id"})} for item in body.items()
    ]
    await store.put(StoredResponse(response, items, conversation))


def _output_messages(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output as the chat messages a continuation starts from."""
    messages: list[dict[str, Any]] = []
    for item in output:
        if item["type"] == "message":
            messages.append({"role": "assistant", "content": "".join(p["text"] for p in item["content"])})
        elif item["type"] == "function_call":
            call = {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
            if messages and messages[-1].get("tool_calls") is not None:
                messages[-1]["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "tool_calls": [call]})
    return messages


def not_found(response_id: str, param: str | None = None) -> APIError:
    return APIError(404, f"No response found with id '{response_id}'.", param=param, code="response_not_found")


async def _stored(response_id: str) -> StoredResponse:
    service: ModelService = current_app.config["OVTRIO_SERVICE"]
    entry = await service.responses.get(response_id)
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
    service: ModelService = current_app.config["OVTRIO_SERVICE"]
    if not await service.responses.delete(response_id):
        raise not_found(response_id)
    return {"id": response_id, "object": "response", "deleted": True}


@blueprint.get("/v3/responses/<response_id>/input_items")
@blueprint.get("/v1/responses/<response_id>/input_items")
async def list_input_items(response_id: str) -> Any:
    items = (await _stored(response_id)).input_items
    return {
        "object": "list",
        "data": items,
        "first_id": items[0]["id"] if items else None,
        "last_id": items[-1]["id"] if items else None,
        "has_more": False,
    }


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def output_items(choice: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat choice as Response output items: reasoning, message, function calls."""
    message = choice["message"]
    incomplete = choice["finish_reason"] == "length"
    items: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        items.append(
            {
                "id": _new_id("rs"),
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": message["reasoning_content"]}],
            }
        )
    if message.get("content") or not message.get("tool_calls"):
        items.append(
            {
                "id": _new_id("msg"),
                "type": "message",
                "role": "assistant",
                "status": "incomplete" if incomplete else "completed",
                "content": [
                    {
                        "type": "output_text",
                        "text": message.get("content") or "",
                        "annotations": [],
                        "logprobs": (choice.get("logprobs") or {}).get("content") or [],
                    }
                ],
            }
        )
    for call in message.get("tool_calls") or []:
        items.append(
            {
                "id": _new_id("fc"),
                "type": "function_call",
                "status": "completed",
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
            }
        )
    return items


def _tool_choice(body: ResponsesRequest) -> Any:
    if isinstance(body.tool_choice, NamedToolChoice):
        return {"type": "function", "name": body.tool_choice.function_name()}
    return body.effective_tool_choice()


def _tools(body: ResponsesRequest) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters or {"type": "object", "properties": {}},
            "strict": bool(spec.strict),
        }
        for spec in body.tool_specs()
    ]


def _text_format(body: ResponsesRequest) -> dict[str, Any]:
    fmt = body.output_format()
    if not fmt:
        return {"type": "text"}
    if fmt.get("type") == "json_schema" and isinstance(fmt.get("json_schema"), dict):
        return {"type": "json_schema", **fmt["json_schema"]}  # chat's nesting, echoed flat
    return fmt


def response_envelope(
    body: ResponsesRequest,
    response_id: str,
    created_at: int,
    model: str,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, int] | None,
    incomplete: bool,
    error: dict[str, Any] | None,
) -> dict[str, Any]:
    """The Response object, at any stage of its life (in_progress while streaming)."""
    response = {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "completed_at": int(time.time()) if status in ("completed", "incomplete") else None,
        "status": status,
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "model": model,
        "output": list(output),
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": body.reasoning.effort, "summary": None} if body.reasoning else None,
        "store": body.store,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "text": {"format": _text_format(body)},
        "tool_choice": _tool_choice(body),
        "tools": _tools(body),
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "truncation": "disabled",
        "metadata": body.metadata or {},
    }
    if usage is not None:
        response["usage"] = {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        }
    return response
