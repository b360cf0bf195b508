"""Forced tool calls: `tool_choice` "required" or a named function, enforced by
constrained decoding so that even a small model emits a call whose arguments validate
against the function's parameters schema.

The decoder is held to a JSON array of {"name": ..., "arguments": {...}} objects, read
back into OpenAI tool calls by ForcedCallsParser as it streams. Shared by chat
completions and the Responses API.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ovtrio.constraints import ConstraintError, OutputConstraint, checked_schema
from ovtrio.tool_parsers import MistralToolParser, new_call_id

# A forced "required" choice may make several calls (parallel_tool_calls); a small model
# left unbounded can keep adding them, so the array is capped.
MAX_PARALLEL_CALLS = 4


@dataclass(frozen=True)
class FunctionTool:
    name: str
    description: str | None
    parameters: dict[str, Any] | None


def forced_call_constraint(
    tools: list[FunctionTool], *, only: str | None = None, parallel: bool = True, param: str = "tools"
) -> OutputConstraint:
    """The constraint for calling `only` (a named tool_choice), or any of `tools`."""
    variants = []
    for i, tool in enumerate(tools):
        if only is not None and tool.name != only:
            continue
        parameters = tool.parameters or {"type": "object", "properties": {}}
        arguments = json.loads(checked_schema(parameters, f"{param}[{i}].function.parameters"))
        variants.append(
            {
                "type": "object",
                "properties": {"name": {"type": "string", "enum": [tool.name]}, "arguments": arguments},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    if not variants:
        raise ConstraintError("tool_choice names no tool that was sent.", "tool_choice")
    most = 1 if only is not None or not parallel else MAX_PARALLEL_CALLS
    call = variants[0] if len(variants) == 1 else {"anyOf": variants}
    schema = {"type": "array", "items": call, "minItems": 1, "maxItems": most}
    return OutputConstraint(json_schema=json.dumps(schema))


class ForcedCallsParser(MistralToolParser):
    """Reads the array forced_call_constraint makes the model write, as it is written:
    the same shape as Mistral's `[TOOL_CALLS][...]`, so that parser's array reading
    streams each call (name first, then argument fragments), with OpenAI-style ids."""

    def __init__(self) -> None:
        super().__init__()
        self.feed(self.TAG)  # the output is the array that follows the tag

    def _new_id(self) -> str:
        return new_call_id()
