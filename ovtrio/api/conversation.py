"""The chat part of the pipeline, shared by chat completions and the Responses API: a
conversation laid out as the chat template reads it and encoded, the output constraint
of a forced tool_choice, and the OutputStage that reads reasoning and tool calls out of
the reply."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import Any

from ovtrio.api.formats import FunctionTool, forced_call_constraint
from ovtrio.api.protocol import ChatMessage, FunctionSpec, NamedToolChoice, ToolAndReasoningFields
from ovtrio.model.prompts import ChatPrompt
from ovtrio.output import OutputStage
from ovtrio.parsing import ForcedCallsParser, ReasoningSplitter
from ovtrio.scheduler import OutputConstraint
from ovtrio.service import ServingModel

FormatReader = Callable[[Any], OutputConstraint | None]


def encode_conversation(
    model: ServingModel, body: ToolAndReasoningFields, messages: list[ChatMessage], raw: bool = False
) -> tuple[ChatPrompt, list[FunctionSpec]]:
    """The prompt for a conversation and the tools shown to the model; with `raw`, the
    messages' text as is (nvext.use_raw_prompt).

    OpenVINO GenAI's template engine gives templates without tool support a polyfill
    (a system prompt listing the tools and a {"tool_calls": [...]} reply format), so
    every model can be shown tools.
    """
    tools = body.tool_specs() if body.effective_tool_choice() != "none" else []
    if raw:
        return model.prompts.encode_raw_chat("".join(m.text() for m in messages)), tools
    prompt = model.prompts.encode_chat(
        template_messages(messages),
        tools=[_template_tool(spec) for spec in tools],
        template_kwargs=body.template_kwargs(),
    )
    return prompt, tools


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages laid out as a chat template reads them."""
    return [_template_message(m) for m in messages]


def forced(body: ToolAndReasoningFields) -> bool:
    return body.effective_tool_choice() in ("required", "function")


def output_constraint(body: ToolAndReasoningFields, read_format: FormatReader) -> OutputConstraint | None:
    """What constrained decoding holds the reply to: the forced tool call, or the
    requested output format (read by the endpoint's own rules)."""
    if not forced(body):
        return read_format(body.output_format())
    tools = [FunctionTool(t.name, t.description, t.parameters) for t in body.tool_specs()]
    only = body.tool_choice.function_name() if isinstance(body.tool_choice, NamedToolChoice) else None
    return forced_call_constraint(tools, only=only, parallel=body.parallel_tool_calls is not False)


def chat_stage(
    model: ServingModel, body: Any, prompt: ChatPrompt, tools: list[FunctionSpec]
) -> tuple[OutputStage, frozenset[int]]:
    """The stage that reads a chat reply (content, reasoning, tool calls), and the
    special tokens its tool-call parser needs to see in the text."""
    # skip_special_tokens=false asks for the raw text: no parser touches it.
    parse = body.skip_special_tokens
    if forced(body):
        tool_parser: Any = ForcedCallsParser
    else:
        tool_parser = model.tool_parser if parse and tools and body.effective_tool_choice() == "auto" else None
    # A forced call is the whole reply, thinking or not.
    thinking = parse and model.reasoning and not forced(body)
    # The parser must see its format's tags even where they are special tokens.
    markers = model.prompts.special_token_ids(tool_parser.MARKERS) if tool_parser else frozenset()
    stage = OutputStage(
        reasoning=partial(ReasoningSplitter, prompt.opens_reasoning) if thinking else None,
        tool_parser=tool_parser,
        logprobs=model.prompts.output_bytes(body.skip_special_tokens, markers) if body.wants_logprobs() else None,
    )
    return stage, markers


def _template_role(role: str) -> str:
    # "developer" is OpenAI's newer name for "system"; chat templates know only the latter.
    return "system" if role == "developer" else role


def _template_message(message: ChatMessage) -> dict[str, Any]:
    rendered: dict[str, Any] = {"role": _template_role(message.role), "content": message.text()}
    if message.tool_calls:
        rendered["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                # Templates index into arguments (Qwen: `tool_call.arguments | tojson`),
                # so they get the parsed object when the JSON is well formed.
                "function": {"name": call.function.name, "arguments": _maybe_json(call.function.arguments)},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id:
        rendered["tool_call_id"] = message.tool_call_id
    if message.name:
        rendered["name"] = message.name
    return rendered


def _template_tool(spec: FunctionSpec) -> dict[str, Any]:
    function: dict[str, Any] = {"name": spec.name, "parameters": spec.parameters or {"type": "object", "properties": {}}}
    if spec.description:
        function["description"] = spec.description
    return {"type": "function", "function": function}


def _maybe_json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text
