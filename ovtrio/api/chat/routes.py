"""POST /v3/chat/completions and /v1/chat/completions."""

from __future__ import annotations

from typing import Any

from quart import Blueprint

from ovtrio.api.chat.writer import ChatWriter
from ovtrio.api.chunks import Envelope
from ovtrio.api.context import ready_model
from ovtrio.api.conversation import chat_stage, encode_conversation, output_constraint
from ovtrio.api.formats import from_response_format
from ovtrio.api.pipeline import check_model, event_stream, generation_request, include_usage, parse_body, unary_outcome
from ovtrio.api.protocol import ChatCompletionRequest
from ovtrio.ids import new_id

blueprint = Blueprint("chat", __name__)


@blueprint.post("/v3/chat/completions")
@blueprint.post("/v1/chat/completions")
async def create_chat_completion() -> Any:
    body = await parse_body(ChatCompletionRequest)
    model = ready_model()
    check_model(model, body)
    raw = bool(body.nvext and body.nvext.use_raw_prompt)
    prompt, tools = encode_conversation(model, body, body.messages, raw)
    stage, markers = chat_stage(model, body, prompt, tools)
    constraint = output_constraint(body, from_response_format)
    generation = generation_request(model, body, [prompt.ids], constraint=constraint, keep_special_token_ids=markers)
    envelope = Envelope(new_id("chatcmpl-"), model.name, model.system_fingerprint, include_usage(body))
    writer = ChatWriter(envelope, choices=body.n, logprobs=body.logprobs)
    if body.stream:
        return event_stream(model, generation, stage, writer)
    return writer.completion(await unary_outcome(model, generation, stage, body.n))
