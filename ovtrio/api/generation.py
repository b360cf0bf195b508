"""POST /v3/completions and /v3/chat/completions (and their /v1 aliases)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

from pydantic import ValidationError
from quart import Blueprint, Response, current_app, request

from ovtrio.api.errors import APIError, from_validation_error, invalid, model_not_found
from ovtrio.api.formatting import ChatFormatter, CompletionFormatter, Formatter
from ovtrio.api.prompts import ChatPrompt
from ovtrio.api.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest, SamplingFields
from ovtrio.api.responding import EventStream, unary_body
from ovtrio.api.sampling import sampling_params
from ovtrio.reasoning import ReasoningSplitter
from ovtrio.scheduler import GenerationRequest, UnsupportedParams
from ovtrio.service import ModelService
from ovtrio.tool_choice import ForcedCallsParser

blueprint = Blueprint("generation", __name__)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def ready_service() -> ModelService:
    service: ModelService = current_app.config["OVTRIO_SERVICE"]
    if not service.ready.is_set():
        raise APIError(503, "The model is still loading; retry shortly.", code="model_loading")
    return service


async def parse_body(model_type: type[SamplingFields]) -> Any:
    raw = await request.get_data(as_text=False)
    try:
        return model_type.model_validate_json(raw)
    except ValidationError as exc:
        raise from_validation_error(exc) from None


def generation_request(
    service: ModelService,
    body: SamplingFields,
    prompts: list[list[int]],
    keep_special_token_ids: frozenset[int] = frozenset(),
) -> GenerationRequest:
    """The scheduler's request: checked sampling settings plus the tokenized prompts."""
    longest = max(len(p) for p in prompts)
    params = sampling_params(body, longest, service.sequence_limit, service.defaults)
    if keep_special_token_ids:
        params = replace(params, keep_special_token_ids=keep_special_token_ids)
    return GenerationRequest(prompts, params)


async def respond(
    service: ModelService,
    body: SamplingFields,
    prompts: list[list[int]],
    formatter: Formatter,
    keep_special_token_ids: frozenset[int] = frozenset(),
    render: Any = None,
) -> Any:
    generation = generation_request(service, body, prompts, keep_special_token_ids)
    params = generation.params
    assert service.scheduler is not None
    try:
        if body.stream:
            events = await EventStream(service.scheduler, generation, formatter, render).open()
            return Response(events, mimetype="text/event-stream", headers=SSE_HEADERS)
        return await unary_body(service.scheduler, generation, formatter)
    except UnsupportedParams as exc:  # refused by the engine when the request was added
        param = "response_format" if params.constraint is not None else None
        raise invalid(f"The engine cannot run this request: {exc}", param) from None


def check_model(service: ModelService, body: SamplingFields) -> None:
    if body.model != service.model_name:
        raise model_not_found(body.model)


def include_usage(body: SamplingFields) -> bool:
    return bool(body.stream and body.stream_options and body.stream_options.include_usage)


@blueprint.post("/v3/completions")
@blueprint.post("/v1/completions")
async def create_completion() -> Any:
    body: CompletionRequest = await parse_body(CompletionRequest)
    service = ready_service()
    check_model(service, body)
    assert service.prompts is not None
    prompts = service.prompts.encode_completion_prompts(body.prompt)
    echo = service.prompts.prompt_texts(body.prompt, prompts) if body.echo else None
    formatter = CompletionFormatter(
        service.model_name,
        service.system_fingerprint,
        service.prompts.token_bytes,
        include_usage=include_usage(body),
        logprobs=body.logprobs is not None,
        choices=len(prompts) * body.n,
        echo=echo,
        n=body.n,
    )
    return await respond(service, body, prompts, formatter)


def chat_formatter(
    service: ModelService, body: ChatCompletionRequest | Any, prompt: ChatPrompt, tools: list[Any], choices: int
) -> tuple[ChatFormatter, frozenset[int]]:
    """The formatter that shapes a chat reply (content, reasoning, tool calls), and the
    special tokens its tool-call parser needs to see. Shared with the Responses API."""
    assert service.prompts is not None
    tool_choice = body.effective_tool_choice()
    # skip_special_tokens=false asks for the raw text: no parser touches it.
    parse = body.skip_special_tokens
    forced = tool_choice in ("required", "function")
    if forced:
        tool_parser = ForcedCallsParser
    else:
        tool_parser = service.tool_parser if parse and tools and tool_choice == "auto" else None
    formatter = ChatFormatter(
        service.model_name,
        service.system_fingerprint,
        service.prompts.token_bytes,
        include_usage=include_usage(body),
        logprobs=body.logprobs,
        choices=choices,
        tool_parser=tool_parser,
        # A forced call is the whole reply, thinking or not.
        reasoning=partial(ReasoningSplitter, prompt.opens_reasoning) if parse and service.reasoning and not forced else None,
    )
    # The parser must see its format's tags even where they are special tokens.
    markers = service.prompts.special_token_ids(tool_parser.MARKERS) if tool_parser else frozenset()
    return formatter, markers


def encode_conversation(service: ModelService, body: Any, messages: list[ChatMessage], raw: bool = False) -> tuple[ChatPrompt, list[Any]]:
    """The prompt for a conversation and the tools shown to the model.

    OpenVINO GenAI's template engine gives templates without tool support a polyfill
    (a system prompt listing the tools and a {"tool_calls": [...]} reply format), so
    every model can be shown tools.
    """
    assert service.prompts is not None
    tools = body.tool_specs() if body.effective_tool_choice() != "none" else []
    prompt = service.prompts.encode_chat(messages, raw=raw, tools=tools, template_kwargs=body.template_kwargs())
    return prompt, tools


@blueprint.post("/v3/chat/completions")
@blueprint.post("/v1/chat/completions")
async def create_chat_completion() -> Any:
    body: ChatCompletionRequest = await parse_body(ChatCompletionRequest)
    service = ready_service()
    check_model(service, body)
    raw = bool(body.nvext and body.nvext.use_raw_prompt)
    prompt, tools = encode_conversation(service, body, body.messages, raw)
    formatter, markers = chat_formatter(service, body, prompt, tools, body.n)
    return await respond(service, body, [prompt.ids], formatter, markers)
