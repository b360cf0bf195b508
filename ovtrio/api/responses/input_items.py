"""A stored input item as GET /v1/responses/{id}/input_items lists it: OpenAI's item
resources (`ItemResource` in its OpenAPI spec), which the SDKs type strictly.

A request may give a message's content as a string and its parts in the chat API's
spelling (`text`); the listing gives every message its content as a list of parts
(`input_text` and `input_image` for user, system and developer messages, `output_text`
and `refusal` for assistant ones) and every item a `status`, as OpenAI does. The layout
is made when a page is read, from the item as it was stored, so items stored before
this layout list the same way.
"""

from __future__ import annotations

from typing import Any

# Input items are complete by the time they are stored with their response.
STATUS = "completed"


def listed_item(item: dict[str, Any]) -> dict[str, Any]:
    """The stored `item` (an input item with its id, as the request gave it) laid out as
    OpenAI lists it."""
    kind = item.get("type", "message")
    if kind == "function_call":
        return {
            "id": item["id"],
            "type": "function_call",
            "call_id": item["call_id"],
            "name": item["name"],
            "arguments": item["arguments"],
            "status": STATUS,
        }
    if kind == "function_call_output":
        return {
            "id": item["id"],
            "type": "function_call_output",
            "call_id": item["call_id"],
            "output": item["output"],
            "status": STATUS,
        }
    if kind == "reasoning":
        return {"id": item["id"], "type": "reasoning", "summary": item.get("summary") or []}
    role = item.get("role") or "user"
    content = item.get("content")
    parts: list[dict[str, Any]] = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
    laid_out = [_output_part(part) if role == "assistant" else _input_part(part) for part in parts]
    return {"id": item["id"], "type": "message", "role": role, "content": laid_out, "status": STATUS}


def _input_part(part: dict[str, Any]) -> dict[str, Any]:
    if part.get("type") == "input_image":
        return {"type": "input_image", "image_url": part.get("image_url"), "detail": part.get("detail") or "auto"}
    return {"type": "input_text", "text": part.get("text") or ""}


def _output_part(part: dict[str, Any]) -> dict[str, Any]:
    if part.get("type") == "refusal":
        return {"type": "refusal", "refusal": part.get("text") or part.get("refusal") or ""}
    return {"type": "output_text", "text": part.get("text") or "", "annotations": [], "logprobs": []}
