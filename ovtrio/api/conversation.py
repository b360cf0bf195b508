"""The chat part of the pipeline, shared by chat completions and the Responses API: a
conversation laid out as the chat template reads it and encoded, the output constraint
of a forced tool_choice, and the OutputStage that reads reasoning and tool calls out of
the reply."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from typing import Any

import trio

from ovtrio.api.compact_json import compact_json
from ovtrio.api.errors import invalid
from ovtrio.api.formats import FunctionTool, forced_call_constraint
from ovtrio.api.protocol import ChatMessage, FunctionSpec, NamedToolChoice, TextPart, ToolAndReasoningFields
from ovtrio.api.text_limits import check_prompt_chars, message_texts, tokenized
from ovtrio.model.vision import IMAGE_TAG
from ovtrio.output import OutputStage
from ovtrio.parsing import ForcedCallsParser, ReasoningSplitter, ToolCallParser
from ovtrio.scheduler import OutputConstraint
from ovtrio.serving.service import ServingModel
from ovtrio.text.prompts import ChatPrompt
from ovtrio.text.template_text import map_strings

FormatReader = Callable[[Any], OutputConstraint | None]


async def encode_conversation(
    model: ServingModel,
    body: ToolAndReasoningFields,
    messages: list[ChatMessage],
    raw: bool = False,
    image_params: Callable[[int, int], str] = lambda message, part: f"messages[{message}].content[{part}].image_url",
) -> tuple[ChatPrompt, list[FunctionSpec]]:
    """The prompt for a conversation and the tools shown to the model; with `raw`, the
    messages' text as is (nvext.use_raw_prompt). A conversation too long to fit the
    context is refused before it is tokenized (api/text_limits.py). `image_params`
    names the request field of an image (message index, part index), for errors. For
    a vision-language model the prompt keeps its text with the images' tags, and their
    URLs.

    OpenVINO GenAI's template engine gives templates without tool support a polyfill
    (a system prompt listing the tools and a {"tool_calls": [...]} reply format), so
    every model can be shown tools.
    """
    chars = check_prompt_chars(model, message_texts(messages), body.prompt_field)
    tools = body.tool_specs() if body.effective_tool_choice() != "none" else []
    images = _image_refs(model, messages, image_params)
    if raw:
        if model.vision is not None:  # the engine puts the images before the text
            text = "".join(m.text() for m in messages)
            ids = (await tokenized(chars, model.prompts.encode_raw_chat, text)).ids
            ids += model.prompts.image_placeholders(len(images), model.vision.tokens_per_image)
            return ChatPrompt(ids, False, text=text, images=tuple(images)), tools
        return await tokenized(chars, model.prompts.encode_raw_chat, "".join(m.text() for m in messages)), tools
    # A vision-language model's engine reads the prompt as text: what the client wrote is
    # made unreadable as image tags (and special tokens) first. Otherwise the prompt's
    # ids keep the client's text as text (text/plain_text.py).
    as_text = vision_text(model, body.parse_special)
    prompt = await tokenized(
        chars,
        model.prompts.encode_chat,
        template_messages(messages, tagged=model.vision is not None, as_text=as_text),
        tools=[_template_tool(spec, as_text) for spec in tools],
        template_kwargs=body.template_kwargs(),
        tokens_per_image=model.vision.tokens_per_image if model.vision is not None else None,
        parse_special=body.parse_special,
    )
    return replace(prompt, images=tuple(images)), tools


async def encode_continuing(
    model: ServingModel, body: ToolAndReasoningFields, messages: list[ChatMessage]
) -> ChatPrompt:
    """encode_conversation's prompt, except that a conversation ending with an
    assistant message (without tool calls) is continued rather than answered: the
    prompt is the conversation before it, the assistant's turn opened, then its text
    (Anthropic's "prefill", Ollama's continued message), so the reply carries on from
    where that text stops."""
    prefill = ""
    if len(messages) > 1 and messages[-1].role == "assistant" and not messages[-1].tool_calls:
        prefill = messages[-1].text()
        messages = messages[:-1]
    prompt, _ = await encode_conversation(model, body, messages)
    if not prefill:
        return prompt
    # The client's text: special-token text in it is text (encode_content).
    ids = prompt.ids + model.prompts.encode_content(prefill, parse_special=body.parse_special)
    text = None
    if prompt.text is not None:
        text = prompt.text + model.prompts.engine_text(prefill, parse_special=body.parse_special)
    return replace(prompt, ids=ids, text=text)


def vision_text(model: ServingModel, parse_special: bool | None) -> Callable[[str], str] | None:
    """For a vision-language model, what its engine is to be given of a client's text
    (PromptBuilder.engine_text); None for a model that takes token ids."""
    if model.vision is None:
        return None
    return partial(model.prompts.engine_text, parse_special=parse_special)


def template_messages(
    messages: list[ChatMessage], tagged: bool = False, as_text: Callable[[str], str] | None = None
) -> list[dict[str, Any]]:
    """Messages laid out as a chat template reads them; with `tagged`, each image of the
    conversation as the engine's tag in the text, numbered in order. `as_text`, when
    given, is applied to every string the client wrote (not to those tags)."""
    counter = itertools.count()
    return [_template_message(m, counter if tagged else None, as_text) for m in messages]


def _image_refs(
    model: ServingModel, messages: list[ChatMessage], params: Callable[[int, int], str]
) -> list[tuple[str, str]]:
    """Each image of the conversation, in order: its URL and the request field that
    holds it (`params(message index, part index)`). A model that reads text only
    refuses them."""
    refs: list[tuple[str, str]] = []
    for i, message in enumerate(messages):
        for j, part in message.image_parts():
            param = part.source_param or params(i, j)
            if model.vision is None:
                raise invalid(
                    f"This model reads text only; image parts cannot be used ({param}).", param, "unsupported_input"
                )
            refs.append((part.url, param))
    if model.vision is not None and len(refs) > model.image_limits.max_images:
        raise invalid(
            f"This request has {len(refs)} images; this server takes at most {model.image_limits.max_images} in one"
            " request (--max-images-per-request).",
            refs[model.image_limits.max_images][1],
            "too_many_images",
        )
    return refs


def forced(body: ToolAndReasoningFields) -> bool:
    return body.effective_tool_choice() in ("required", "function")


async def output_constraint(
    body: ToolAndReasoningFields, read_format: FormatReader, max_schema_bytes: int | None = None
) -> OutputConstraint | None:
    """What constrained decoding holds the reply to: the forced tool call, or the
    requested output format (read by the endpoint's own rules). Each tool's parameters
    and the output format are first held to `max_schema_bytes` of JSON: the engine
    compiles a schema into a grammar hundreds of times its size, and checking it takes
    time proportional to it (see docs/benchmarks.md#structured-output-grammars). A
    schema is read in a worker thread: its check against JSON Schema's meta-schema takes
    milliseconds even for a few hundred bytes, which the event loop would stand still
    for (every new schema; the scheduler then compiles it in a process of its own)."""
    if max_schema_bytes is not None:
        check_schema_sizes(body, max_schema_bytes)
    if not forced(body) and body.output_format() is None:
        return None
    return await trio.to_thread.run_sync(partial(_output_constraint, body, read_format))


def _output_constraint(body: ToolAndReasoningFields, read_format: FormatReader) -> OutputConstraint | None:
    if not forced(body):
        return read_format(body.output_format())
    tools = [FunctionTool(t.name, t.description, t.parameters) for t in body.tool_specs()]
    only = body.tool_choice.function_name() if isinstance(body.tool_choice, NamedToolChoice) else None
    return forced_call_constraint(tools, only=only, parallel=body.parallel_tool_calls is not False)


def check_schema_sizes(body: ToolAndReasoningFields, max_bytes: int) -> None:
    for i, spec in enumerate(body.tool_specs()):
        _check_size(spec.parameters, max_bytes, f"tools[{i}].function.parameters")
    fmt = body.output_format()
    text = getattr(body, "text", None)
    _check_size(fmt, max_bytes, "text.format" if text is not None and text.format is not None else "response_format")


def _check_size(schema: Any, max_bytes: int, param: str) -> None:
    if schema is None:
        return
    size = len(compact_json(schema).encode())
    if size > max_bytes:
        raise invalid(
            f"Invalid value for '{param}': the schema is {size} bytes of JSON; this server takes schemas of at"
            f" most {max_bytes} bytes (--max-schema-bytes).",
            param,
            "schema_too_large",
        )


def chat_stage(
    model: ServingModel, body: Any, prompt: ChatPrompt, tools: list[FunctionSpec]
) -> tuple[OutputStage, frozenset[int]]:
    """The stage that reads a chat reply (content, reasoning, tool calls), and the
    special tokens its tool-call parser needs to see in the text."""
    # skip_special_tokens=false asks for the raw text: no parser touches it.
    parse = body.skip_special_tokens
    auto = bool(tools) and body.effective_tool_choice() == "auto"
    tool_parser: type[ToolCallParser] | None = None
    channels = model.tool_parser is not None and model.tool_parser.CHANNELS
    if channels:  # raw text or not, the model writes its channels
        _check_channel_constraints(body)
    if channels and parse:
        assert model.tool_parser is not None
        tool_parser = model.tool_parser
        make_parser = tool_parser.for_request({spec.name: spec.parameters for spec in tools} if auto else {})
    elif forced(body):
        tool_parser = make_parser = ForcedCallsParser
    elif model.tool_parser is not None and parse and auto:
        tool_parser = model.tool_parser
        make_parser = tool_parser.for_request({spec.name: spec.parameters for spec in tools})
    # A forced call is the whole reply, thinking or not.
    thinking = parse and model.reasoning and not forced(body)
    # The parser must see its format's tags even where they are special tokens.
    markers = model.prompts.special_token_ids(tool_parser.MARKERS) if tool_parser else frozenset()
    stage = OutputStage(
        reasoning=partial(ReasoningSplitter, prompt.opens_reasoning) if thinking else None,
        tool_parser=make_parser if tool_parser else None,
        logprobs=model.prompts.output_bytes(body.skip_special_tokens, markers) if body.wants_logprobs() else None,
    )
    return stage, markers


def _check_channel_constraints(body: Any) -> None:
    """A model that writes channels (harmony) reasons before it answers, on a channel of
    its own. Constrained decoding would hold the whole reply, channel headers and
    reasoning included, to the schema; the engine's structural tags could hold one
    channel's body to it, but would not make the model open that channel at all. Rather
    than an answer that only looks constrained, such requests are refused."""
    if forced(body):
        raise invalid(
            "This model writes its replies on harmony channels, and this server cannot hold one channel to a"
            " forced tool call; use tool_choice 'auto'.",
            "tool_choice",
            "unsupported_parameter",
        )
    fmt = body.output_format()
    if fmt is not None and fmt.get("type") != "text":
        text = getattr(body, "text", None)
        param = "text.format" if text is not None and text.format is not None else "response_format"
        raise invalid(
            "This model writes its replies on harmony channels, and this server cannot hold its final channel"
            " alone to a format; leave the format unset and ask for it in the messages.",
            param,
            "unsupported_parameter",
        )


def _template_role(role: str) -> str:
    # "developer" is OpenAI's newer name for "system"; chat templates know only the latter.
    return "system" if role == "developer" else role


def _template_message(
    message: ChatMessage, image_numbers: Iterator[int] | None = None, as_text: Callable[[str], str] | None = None
) -> dict[str, Any]:
    text = as_text or (lambda value: value)
    content = text(message.text())
    if image_numbers is not None and message.image_parts():
        # Text and images in their order: each image as the engine's numbered tag.
        assert isinstance(message.content, list)
        content = "".join(
            text(part.text) if isinstance(part, TextPart) else IMAGE_TAG.format(next(image_numbers))
            for part in message.content
        )
    rendered: dict[str, Any] = {"role": _template_role(message.role), "content": content}
    if as_text is not None:
        # Everything else the client wrote: tool calls, names, ids.
        return {**rendered, **map_strings(_other_fields(message), as_text)}
    return {**rendered, **_other_fields(message)}


def _other_fields(message: ChatMessage) -> dict[str, Any]:
    """What a chat template reads of a message besides its role and content."""
    rendered: dict[str, Any] = {}
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


def _template_tool(spec: FunctionSpec, as_text: Callable[[str], str] | None = None) -> dict[str, Any]:
    function: dict[str, Any] = {
        "name": spec.name,
        "parameters": spec.parameters or {"type": "object", "properties": {}},
    }
    if spec.description:
        function["description"] = spec.description
    tool = {"type": "function", "function": function}
    return map_strings(tool, as_text) if as_text is not None else tool


def _maybe_json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text
