"""A Responses request made ready to run, the same way for HTTP and the WebSocket:
previous_response_id resolved, the conversation encoded, the scheduler's request and
the output stage built (running.py runs it and stores it once it has finished)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial

from ovtrio.api.conversation import chat_stage, encode_conversation, output_constraint
from ovtrio.api.errors import APIError
from ovtrio.api.formats import from_responses_format
from ovtrio.api.generation import generation_request
from ovtrio.api.protocol import ChatMessage
from ovtrio.api.responses.body import response_envelope
from ovtrio.api.responses.events import Envelope
from ovtrio.api.responses.protocol import ResponsesRequest
from ovtrio.api.responses.store import ResponseStore
from ovtrio.api.vision import text_prompts
from ovtrio.output import OutputStage
from ovtrio.parsing.ids import new_id
from ovtrio.scheduler import GenerationRequest
from ovtrio.serving.service import ServingModel


@dataclass
class PreparedResponse:
    """A Responses request ready to run: the scheduler's request, the stage that reads
    its output, and the response envelope with the request's part bound."""

    body: ResponsesRequest
    envelope: Envelope
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
    constraint = await output_constraint(body, from_responses_format, model.caps.schema_bytes)
    texts = await text_prompts(model, prompt)
    generation = generation_request(
        model, body, [prompt.ids], constraint=constraint, keep_special_token_ids=markers, texts=texts
    )
    return PreparedResponse(body, envelope, generation, stage, previous)
