"""An Ollama request made ready to run on the chat path: the request translated into
the chat completions body that path reads (its options as sampling fields, `format` as
response_format, `think` as the template's enable_thinking, `tools`), its conversation
into chat messages, encoded by the chat template, and the scheduler's request and
output stage built from them, as chat completions builds its own. Every check of that
path applies, and what it refuses is named by the Ollama field that asked for it.

What the translation decides:

* A message's `images` (base64) come before its text, as Ollama lays them out; an
  assistant message's `tool_calls` (arguments an object) are the history's calls, and a
  `tool` message answers its `tool_call_id`, or else the latest call of its
  `tool_name`. An earlier turn's `thinking` is left out of the prompt. A conversation
  that ends with an assistant message is continued from its text, as Ollama does.
* /api/generate's `prompt` is one user message after `system`; with `raw` it is the
  prompt as it is, without the template (and without `system`).
* `think`: true or a level sets the template's enable_thinking (a level is also passed
  as reasoning_effort), false clears it, absent leaves the template's default.
* `format`: "json" holds the reply to a JSON object, a schema to that schema.
* `options.tool_choice` (this server's, which Ollama ignores as an unknown option):
  "auto", "none", "required" or a tool's name, as chat completions' tool_choice.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ovtrio.api.conversation import chat_stage, encode_continuing, encode_conversation, output_constraint
from ovtrio.api.errors import APIError, api_error, invalid
from ovtrio.api.formats import checked_schema, from_response_format
from ovtrio.api.generation import generation_request
from ovtrio.api.ollama.options import OPTION_OF
from ovtrio.api.ollama.protocol import ChatRequest, GenerateRequest, GenerationBody, Message
from ovtrio.api.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    ImagePart,
    TextPart,
    ToolCallRef,
)
from ovtrio.api.vision import text_prompts
from ovtrio.output import OutputStage
from ovtrio.scheduler import GenerationRequest
from ovtrio.serving.service import ServingModel


@dataclass
class Prepared:
    """An Ollama request ready to run."""

    generation: GenerationRequest
    stage: OutputStage
    prompt_tokens: int


def chat_body(body: GenerationBody, model_id: str, messages: list[ChatMessage]) -> ChatCompletionRequest:
    """The chat completions body the request stands for, validated by that body's rules
    (errors renamed by `ollama_names`)."""
    fields: dict[str, Any] = {"model": model_id, "messages": messages, "stream": body.stream}
    options = body.options
    if options is not None:
        fields.update(options.sampling_fields())
        if options.tool_choice is not None:
            choice = options.tool_choice
            fields["tool_choice"] = (
                choice if choice in ("auto", "none", "required") else {"type": "function", "function": {"name": choice}}
            )
    if body.logprobs:
        fields["logprobs"] = True
    if fields.get("stop") is not None:
        fields["include_stop_str_in_output"] = False
    if body.format == "json":
        fields["response_format"] = {"type": "json_object"}
    elif isinstance(body.format, dict):
        fields["response_format"] = {"type": "json_schema", "json_schema": {"name": "format", "schema": body.format}}
    if body.think is not None:
        fields["chat_template_kwargs"] = {"enable_thinking": body.think is not False}
        if isinstance(body.think, str):
            fields["reasoning_effort"] = body.think
    if isinstance(body, ChatRequest) and body.tools:
        fields["tools"] = body.tools
    return ChatCompletionRequest.model_validate(fields)


def chat_messages(messages: list[Message]) -> list[ChatMessage]:
    """The conversation as chat messages (see the module's docstring)."""
    translated: list[ChatMessage] = []
    calls: dict[str, str] = {}  # a tool's name -> the id of its latest call
    for i, message in enumerate(messages):
        fields: dict[str, Any] = {}
        if message.tool_calls:
            refs = []
            for j, call in enumerate(message.tool_calls):
                call_id = call.id or f"call_{i}_{j}"
                calls[call.function.name] = call_id
                function = FunctionCall.model_construct(
                    name=call.function.name, arguments=json.dumps(call.function.arguments)
                )
                refs.append(ToolCallRef.model_construct(id=call_id, type="function", function=function))
            if message.role != "assistant":
                raise invalid(
                    f"Invalid value for 'messages[{i}].tool_calls': only assistant messages carry tool calls.",
                    f"messages[{i}].tool_calls",
                )
            fields["tool_calls"] = refs
        if message.role == "tool":
            fields["tool_call_id"] = (
                message.tool_call_id or calls.get(message.tool_name or "") or f"call_{message.tool_name or i}"
            )
            if message.tool_name:
                fields["name"] = message.tool_name
        translated.append(_message(message.role, message.content, message.images, f"messages[{i}]", **fields))
    return translated


def prompt_messages(body: GenerateRequest) -> list[ChatMessage]:
    """/api/generate's prompt as a conversation: `system`, then the prompt (raw: the prompt alone)."""
    system = [] if body.raw or not body.system else [_message("system", body.system, None, "system")]
    return system + [_message("user", body.prompt, body.images, "")]


def _message(role: str, text: str, images: list[str] | None, where: str, **fields: Any) -> ChatMessage:
    content: str | list[TextPart | ImagePart] = text
    if images:
        parts: list[TextPart | ImagePart] = [
            ImagePart.model_construct(type="image_url", image_url="data:;base64," + image).held_in(
                f"{where}.images[{j}]" if where else f"images[{j}]"
            )
            for j, image in enumerate(images)
        ]
        content = parts + [TextPart.model_construct(type="text", text=text)] if text else parts
    return ChatMessage.model_construct(
        **{"role": role, "content": content, "name": None, "tool_calls": None, "tool_call_id": None, **fields}
    )


async def prepare(
    model: ServingModel, chat: ChatCompletionRequest, messages: list[ChatMessage], raw: bool = False
) -> Prepared:
    """Everything checked and built before the client is answered; raises what the
    client is to be told."""
    tools = chat.tool_specs() if chat.effective_tool_choice() != "none" else []
    for i, spec in enumerate(tools):
        checked_schema(spec.parameters, f"tools[{i}].function.parameters")
    if raw:
        prompt, _ = await encode_conversation(model, chat, messages, raw=True)
    else:
        prompt = await encode_continuing(model, chat, messages)
    stage, markers = chat_stage(model, chat, prompt, tools)
    constraint = await output_constraint(chat, lambda fmt: from_response_format(fmt, "format"), model.caps.schema_bytes)
    texts = await text_prompts(model, prompt)
    generation = generation_request(
        model, chat, [prompt.ids], constraint=constraint, keep_special_token_ids=markers, texts=texts
    )
    return Prepared(generation, stage, len(prompt.ids))


# Chat completions' fields, and the Ollama fields that set them.
_FIELDS = {
    **OPTION_OF,
    "format.json_schema.schema": "format",
    "format.json_schema": "format",
    "response_format.json_schema.schema": "format",
    "response_format.json_schema": "format",
    "response_format": "format",
    "chat_template_kwargs": "think",
    "reasoning_effort": "think",
    "tool_choice": "options.tool_choice",
}

# Names that are no word of a sentence: renamed where a message says them unquoted too.
_BARE = re.compile(r"(?<![.\w])(max_tokens|tool_choice|response_format|repetition_penalty|chat_template_kwargs)\b")


def ollama_names(error: BaseException, prompt_field: str = "messages") -> APIError:
    """`error` as the client is to be told it, naming the Ollama field at fault rather
    than the chat completions field it became (`prompt_field`: what holds the
    conversation, "prompt" for /api/generate)."""
    found = api_error(error)
    fields = {**_FIELDS, "messages": prompt_field}
    names = sorted(fields, key=len, reverse=True)
    param = found.param
    if param is not None:
        head = next((name for name in names if param == name or param.startswith((name + ".", name + "["))), None)
        if head is not None:
            param = fields[head] + param[len(head) :]
    quoted = re.compile("'(" + "|".join(re.escape(name) for name in names) + ")([.\\[][^']*)?'")
    message = quoted.sub(lambda m: f"'{fields[m.group(1)]}{m.group(2) or ''}'", found.message)
    message = _BARE.sub(lambda m: fields[m.group(0)], message)
    return APIError(found.status, message, param=param, code=found.code, type=found.type, retry_after=found.retry_after)
