"""A Messages request made ready to run on the chat path: the conversation translated
into chat messages, the request into the chat body that path reads (tools, tool_choice,
thinking, output format, sampling), the prompt encoded by the chat template, and the
scheduler's request and output stage built from them, as chat completions builds its
own.

What the translation decides:

* `system` (string or text blocks) is the first system message; a message with role
  "system" stays one.
* A user message's text blocks are one user message; each `tool_result` becomes a tool
  message answering its `tool_use_id` (an `is_error` result says so in its text, since
  chat templates have no other way to).
* An assistant message's text and `tool_use` blocks are one assistant message with tool
  calls. `thinking` and `redacted_thinking` blocks are accepted and left out of the
  prompt, as Anthropic does with earlier turns' thinking.
* A conversation that ends with an assistant message is continued: the prompt is the
  conversation before it, the assistant's turn opened, and its text (Anthropic's
  "prefill"), so the reply carries on from where that text stops.
* `thinking` enabled or adaptive sets the template's `enable_thinking`, disabled clears
  it, absent leaves the template's default; what the model thinks comes back as thinking
  blocks. `budget_tokens` is checked as Anthropic checks it, and not enforced:
  max_tokens bounds thinking and answer together.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ovtrio.api.conversation import chat_stage, encode_continuing, output_constraint
from ovtrio.api.formats import ConstraintError, checked_schema, from_response_format
from ovtrio.api.generation import generation_request
from ovtrio.api.messages.protocol import (
    ImageBlock,
    InputMessage,
    MessagesInput,
    MessagesRequest,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from ovtrio.api.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    FunctionSpec,
    ImagePart,
    NamedToolChoice,
    TextPart,
    Tool,
    ToolCallRef,
)
from ovtrio.api.vision import text_prompts
from ovtrio.output import OutputStage
from ovtrio.scheduler import GenerationRequest
from ovtrio.serving.service import ServingModel
from ovtrio.text.prompts import ChatPrompt

ERROR_RESULT = "Error: "


@dataclass
class PreparedMessage:
    """A Messages request ready to run."""

    body: MessagesRequest
    generation: GenerationRequest
    stage: OutputStage
    input_tokens: int
    stop_sequences: tuple[str, ...]


def chat_body(body: MessagesInput) -> ChatCompletionRequest:
    """The chat completions body the request stands for, built without revalidation
    (the Messages body was validated by its own rules and names)."""
    choice = body.tool_choice_type()
    fields: dict[str, Any] = {
        "model": body.model,
        "messages": [],
        "tools": [_tool(t) for t in body.tools] if body.tools else None,
        "tool_choice": {"auto": "auto", "any": "required", "none": "none"}.get(choice)
        or NamedToolChoice.model_construct(type="function", name=body.tool_choice.name if body.tool_choice else None),
        "parallel_tool_calls": False if body.tool_choice and body.tool_choice.disable_parallel_tool_use else None,
        "chat_template_kwargs": {"enable_thinking": body.thinking.on} if body.thinking else None,
        "parse_special": body.parse_special,
    }
    schema = body.output_format()
    if schema is not None:
        fields["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    if not body.tools:
        fields["tool_choice"] = None
    if isinstance(body, MessagesRequest):
        fields.update(
            max_tokens=body.max_tokens,
            stream=body.stream,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k or None,  # 0: no top-k cut
            stop=list(body.stop_sequences) if body.stop_sequences else None,
            # The scheduler cuts a stop sequence off and names it (writer.py).
            include_stop_str_in_output=False,
        )
    return ChatCompletionRequest.model_construct(**fields)


def _tool(tool: Any) -> Tool:
    spec = FunctionSpec.model_construct(
        name=tool.name, description=tool.description, parameters=tool.input_schema, strict=tool.strict
    )
    return Tool.model_construct(type="function", function=spec)


def chat_messages(body: MessagesInput) -> list[ChatMessage]:
    """The conversation as chat messages (see the module's docstring)."""
    messages: list[ChatMessage] = []
    if body.system:
        system = body.system if isinstance(body.system, str) else "".join(b.text for b in body.system)
        messages.append(ChatMessage.model_construct(role="system", content=system))
    for index, message in enumerate(body.messages):
        messages += _translated(message, index)
    return messages


def _translated(message: InputMessage, index: int) -> list[ChatMessage]:
    if isinstance(message.content, str):
        return [_message(message.role, message.content)]
    if message.role == "assistant":
        text = "".join(b.text for b in message.content if isinstance(b, TextBlock))
        calls = [
            ToolCallRef.model_construct(
                id=b.id,
                type="function",
                function=FunctionCall.model_construct(name=b.name, arguments=json.dumps(b.input)),
            )
            for b in message.content
            if isinstance(b, ToolUseBlock)
        ]
        return [_message("assistant", text, tool_calls=calls or None)]
    translated: list[ChatMessage] = []
    # Text and images of the user's turn, in their order, as chat content parts.
    parts: list[TextPart | ImagePart] = []
    for j, block in enumerate(message.content):
        if isinstance(block, TextBlock):
            parts.append(TextPart.model_construct(type="text", text=block.text))
        elif isinstance(block, ImageBlock):
            image = ImagePart.model_construct(type="image_url", image_url=block.source.as_url())
            parts.append(image.held_in(f"messages[{index}].content[{j}].source"))
        elif isinstance(block, ToolResultBlock):
            if parts:
                translated.append(_message(message.role, _content(parts)))
                parts = []
            content = (ERROR_RESULT if block.is_error else "") + block.text()
            translated.append(_message("tool", content, tool_call_id=block.tool_use_id))
    if parts or not translated:
        translated.append(_message(message.role, _content(parts)))
    return translated


def _content(parts: list[TextPart | ImagePart]) -> str | list[TextPart | ImagePart]:
    """Plain text when there are no images (the form every template reads)."""
    if any(isinstance(part, ImagePart) for part in parts):
        return parts
    return "".join(part.text for part in parts if isinstance(part, TextPart))


def _message(role: str, content: str | list[TextPart | ImagePart], **fields: Any) -> ChatMessage:
    return ChatMessage.model_construct(
        **{"role": role, "content": content, "name": None, "tool_calls": None, "tool_call_id": None, **fields}
    )


async def encode(model: ServingModel, body: MessagesInput, chat: ChatCompletionRequest) -> ChatPrompt:
    """The prompt the request is answered from: its conversation through the chat
    template (encode_continuing, as chat completions encodes its own: size checks,
    long prompts tokenized off the event loop, images), with the tools shown to the
    model; a trailing assistant message is continued rather than answered."""
    tools = chat.tool_specs() if chat.effective_tool_choice() != "none" else []
    for i, spec in enumerate(tools):
        checked_schema(spec.parameters, f"tools[{i}].input_schema")
    return await encode_continuing(model, chat, chat_messages(body))


async def count_tokens(model: ServingModel, body: MessagesInput) -> int:
    return len((await encode(model, body, chat_body(body))).ids)


async def prepare(model: ServingModel, body: MessagesRequest) -> PreparedMessage:
    """Everything checked and built before the client is answered; raises what the
    client is to be told."""
    chat = chat_body(body)
    prompt = await encode(model, body, chat)
    tools = chat.tool_specs() if chat.effective_tool_choice() != "none" else []
    stage, markers = chat_stage(model, chat, prompt, tools)
    try:
        constraint = await output_constraint(
            chat, lambda fmt: from_response_format(fmt, "output_config.format"), model.caps.schema_bytes
        )
    except ConstraintError as exc:
        raise ConstraintError(
            str(exc).replace("output_config.format.json_schema", "output_config.format"), _param(exc)
        ) from None
    texts = await text_prompts(model, prompt)
    generation = generation_request(
        model, chat, [prompt.ids], constraint=constraint, keep_special_token_ids=markers, texts=texts
    )
    # Its output constraint compiled now: a stream answers 200 before it is submitted.
    generation = await model.scheduler.checked(generation)
    return PreparedMessage(body, generation, stage, len(prompt.ids), tuple(body.stop_sequences or ()))


def _param(exc: ConstraintError) -> str | None:
    if exc.param is None:
        return None
    return exc.param.replace("output_config.format.json_schema", "output_config.format").replace(
        ".function.parameters", ".input_schema"
    )
