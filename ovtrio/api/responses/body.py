"""The Response object, at every stage of its life: in_progress while it streams, then
completed, incomplete or failed. Its output items are laid out by events.py, for a
stream and a unary response alike.

A pydantic model (made three times a response, so its cost does not matter) rather than
a dataclass like the events, for `usage`, which OpenAI's spec has absent, never null,
until the response has finished.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, Field

from ovtrio.api.protocol import NamedToolChoice
from ovtrio.api.responses.protocol import ResponsesRequest
from ovtrio.scheduler import Completed


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens: int
    output_tokens_details: dict[str, int]
    total_tokens: int


ResponseStatus = Literal["in_progress", "completed", "incomplete", "failed"]


class Response(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    completed_at: int | None
    status: ResponseStatus
    error: dict[str, str] | None
    incomplete_details: dict[str, str] | None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[Any]  # objects.OutputItem, as they are: already typed, not revalidated
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: dict[str, Any] | None
    store: bool
    temperature: float
    text: dict[str, Any]
    tool_choice: Any
    tools: list[dict[str, Any]]
    top_p: float
    truncation: Literal["disabled"] = "disabled"
    metadata: Any
    usage: ResponseUsage | None = Field(default=None, exclude_if=lambda usage: usage is None)


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
    status: ResponseStatus,
    output: list[Any],
    usage: Completed | None,
    incomplete: bool,
    error: dict[str, str] | None,
) -> Response:
    """The Response object, at any stage of its life (in_progress while streaming)."""
    return Response(
        id=response_id,
        created_at=created_at,
        completed_at=int(time.time()) if status in ("completed", "incomplete") else None,
        status=status,
        error=error,
        incomplete_details={"reason": "max_output_tokens"} if incomplete else None,
        instructions=body.instructions,
        max_output_tokens=body.max_output_tokens,
        model=model,
        output=list(output),
        parallel_tool_calls=body.parallel_tool_calls is not False,
        previous_response_id=body.previous_response_id,
        reasoning={"effort": body.reasoning.effort, "summary": None} if body.reasoning else None,
        store=body.store,
        temperature=1.0 if body.temperature is None else body.temperature,
        text={"format": _text_format(body)},
        tool_choice=_tool_choice(body),
        tools=_tools(body),
        top_p=1.0 if body.top_p is None else body.top_p,
        metadata=body.metadata or {},
        usage=None if usage is None else _usage(usage),
    )


def _usage(done: Completed) -> ResponseUsage:
    return ResponseUsage(
        input_tokens=done.prompt_tokens,
        input_tokens_details={"cached_tokens": 0, "cache_write_tokens": 0},
        output_tokens=done.completion_tokens,
        output_tokens_details={"reasoning_tokens": 0},
        total_tokens=done.prompt_tokens + done.completion_tokens,
    )
