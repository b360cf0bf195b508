"""The Response object and its output items, laid out once for the streamed events
(events.py) and the unary body alike."""

from __future__ import annotations

import time
from typing import Any

from ovtrio.api.chunks import logprob_entries
from ovtrio.api.responses.protocol import ResponsesRequest
from ovtrio.api.protocol import NamedToolChoice
from ovtrio.parsing.ids import new_id
from ovtrio.output import ChoiceResult, Outcome
from ovtrio.scheduler import Completed


def reasoning_item(item_id: str, summary: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": item_id, "type": "reasoning", "summary": summary}


def summary_part(text: str) -> dict[str, Any]:
    return {"type": "summary_text", "text": text}


def message_item(item_id: str, status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def text_part(text: str, logprobs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def function_call_item(item_id: str, status: str, call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call_id, "name": name, "arguments": arguments}


def message_status(finish_reason: str) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def output_items(result: ChoiceResult, logprobs: bool) -> list[dict[str, Any]]:
    """A finished choice as output items: reasoning, message, function calls."""
    items: list[dict[str, Any]] = []
    if result.reasoning:
        items.append(reasoning_item(new_id("rs_"), [summary_part(result.reasoning)]))
    if result.text or not result.tool_calls:
        entries = logprob_entries(result.logprobs or []) if logprobs else []
        items.append(message_item(new_id("msg_"), message_status(result.finish_reason), [text_part(result.text, entries)]))
    for call in result.tool_calls:
        items.append(function_call_item(new_id("fc_"), "completed", call.id, call.name, call.arguments))
    return items


def unary_response(envelope: Any, outcome: Outcome, logprobs: bool) -> dict[str, Any]:
    """The whole response of a unary request. `envelope` is response_envelope with the
    request's part bound."""
    incomplete = any(result.finish_reason == "length" for result in outcome.choices)
    output = [item for result in outcome.choices for item in output_items(result, logprobs)]
    return envelope("incomplete" if incomplete else "completed", output, outcome.usage, incomplete, None)


def _tool_choice(body: ResponsesRequest) -> Any:
    """As OpenAI reports it: "auto" unless the request chose otherwise, with or without
    tools (without tools there is nothing to call, whatever it says)."""
    if isinstance(body.tool_choice, NamedToolChoice):
        return {"type": "function", "name": body.tool_choice.function_name()}
    return body.tool_choice or "auto"


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
    usage: Completed | None,
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
            "input_tokens": usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        }
    return response
