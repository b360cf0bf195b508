"""A Responses request made ready to run, the same way for HTTP and the WebSocket:
previous_response_id resolved, the conversation encoded, the scheduler's request and
the output stage built, and stored once it has finished."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from ovtrio.api.conversation import chat_stage, encode_conversation, output_constraint
from ovtrio.api.errors import APIError
from ovtrio.api.formats import from_responses_format
from ovtrio.api.generation import generation_request
from ovtrio.api.protocol import ChatMessage
from ovtrio.api.responses.body import response_envelope
from ovtrio.api.responses.protocol import ResponsesRequest
from ovtrio.api.responses.store import ResponseStore, StoredResponse
from ovtrio.api.vision import text_prompts
from ovtrio.parsing.ids import new_id
from ovtrio.output import OutputStage
from ovtrio.scheduler import GenerationRequest
from ovtrio.serving.service import ServingModel


@dataclass
class PreparedResponse:
    """A Responses request ready to run: the scheduler's request, the stage that reads
    its output, and the response envelope with the request's part bound."""

    body: ResponsesRequest
    envelope: Callable[..., dict[str, Any]]
    generation: GenerationRequest
    stage: OutputStage
    previous: list[ChatMessage]


def not_found(response_id: str, param: str | None = None) -> APIError:
    return APIError(404, f"No response found with id '{response_id}'.", param=param, code="response_not_found")


async def prepare(model: ServingModel, body: ResponsesRequest, *stores: ResponseStore) -> PreparedResponse:
    """Resolve previous_response_id (in `stores`, first match), build the prompt and
    check the request; raises what the client is to be told. The model name is
    checked by the caller."""
    previous: list[ChatMessage] = []
    if body.previous_response_id is not None:
        earlier = None
        for store in stores:
            if (earlier := await store.get(body.previous_response_id)) is not None:
                break
        if earlier is None:
            raise not_found(body.previous_response_id, "previous_response_id")
        previous = [ChatMessage.model_validate(m) for m in earlier.conversation]
    envelope = partial(response_envelope, body, new_id("resp_"), int(time.time()), model.name)
    # Images of this input name their own field; those of earlier turns come with the
    # previous response.
    prompt, tools = await encode_conversation(
        model, body, body.chat_messages(previous), image_params=lambda message, part: "previous_response_id"
    )
    stage, markers = chat_stage(model, body, prompt, tools)
    constraint = output_constraint(body, from_responses_format, model.caps.schema_bytes)
    texts = await text_prompts(model, prompt)
    generation = generation_request(
        model, body, [prompt.ids], constraint=constraint, keep_special_token_ids=markers, texts=texts
    )
    return PreparedResponse(body, envelope, generation, stage, previous)


async def store_response(store: ResponseStore, ready: PreparedResponse, response: dict[str, Any]) -> None:
    body, previous = ready.body, ready.previous
    current = body.input_messages()
    conversation = [m.model_dump(exclude_none=True) for m in [*previous, *current]] + _output_messages(response["output"])
    items = [
        {"id": item.id or new_id("msg_"), **item.model_dump(exclude_none=True, exclude={"id"})} for item in body.items()
    ]
    await store.put(StoredResponse(response, items, conversation))


def _output_messages(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output as the chat messages a continuation starts from."""
    messages: list[dict[str, Any]] = []
    for item in output:
        if item["type"] == "message":
            messages.append({"role": "assistant", "content": "".join(p["text"] for p in item["content"])})
        elif item["type"] == "function_call":
            call = {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
            if messages and messages[-1].get("tool_calls") is not None:
                messages[-1]["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "tool_calls": [call]})
    return messages
