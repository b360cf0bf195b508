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
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

from quart import Blueprint

from ovtrio.api.formatting import Formatter
from ovtrio.api.generation import chat_formatter, check_model, encode_conversation, parse_body, ready_service, respond
from ovtrio.api.response_events import ResponseEvents, sse
from ovtrio.api.responding import DONE_EVENT, chunk_bodies
from ovtrio.scheduler import RequestStream
from ovtrio.api.protocol import NamedToolChoice
from ovtrio.api.responses_protocol import ResponsesRequest

blueprint = Blueprint("responses", __name__)


@blueprint.post("/v3/responses")
@blueprint.post("/v1/responses")
async def create_response() -> Any:
    body: ResponsesRequest = await parse_body(ResponsesRequest)
    service = ready_service()
    check_model(service, body)
    envelope = partial(response_envelope, body, _new_id("resp"), int(time.time()), service.model_name)
    prompt, tools = encode_conversation(service, body, body.chat_messages())
    formatter, markers = chat_formatter(service, body, prompt, tools, body.n)
    formatter.include_usage = True  # the final event carries usage
    if body.stream:
        return await respond(service, body, [prompt.ids], formatter, markers, render=partial(_events, envelope))
    chat = await respond(service, body, [prompt.ids], formatter, markers)
    incomplete = any(c["finish_reason"] == "length" for c in chat["choices"])
    output = [item for choice in chat["choices"] for item in output_items(choice)]
    return envelope("incomplete" if incomplete else "completed", output, chat["usage"], incomplete, None)


async def _events(envelope: Any, stream: RequestStream, formatter: Formatter) -> AsyncIterator[bytes]:
    writer = ResponseEvents(envelope)
    yield b"".join(sse(event) for event in writer.start())
    while messages := await stream.receive_available():
        events = [event for chunk in chunk_bodies(formatter, messages) for event in writer.on_chunk(chunk)]
        if events:
            yield b"".join(sse(event) for event in events)
    yield DONE_EVENT


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
                    {"type": "output_text", "text": message.get("content") or "", "annotations": [], "logprobs": []}
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
        "previous_response_id": None,
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
