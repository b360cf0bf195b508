"""POST /v3/chat/completions and /v1/chat/completions."""

from __future__ import annotations

from typing import Any

from quart import Blueprint

from ovtrio.api.chat.writer import ChatWriter
from ovtrio.api.conversation import chat_stage, encode_conversation, output_constraint
from ovtrio.api.formats import from_response_format
from ovtrio.api.pipeline import accept, envelope, generation_request, respond
from ovtrio.api.protocol import ChatCompletionRequest
from ovtrio.api.vision import text_prompts

blueprint = Blueprint("chat", __name__)


@blueprint.post("/v3/chat/completions")
@blueprint.post("/v1/chat/completions")
async def create_chat_completion() -> Any:
    body, model = await accept(ChatCompletionRequest)
    raw = bool(body.nvext and body.nvext.use_raw_prompt)
    prompt, tools = await encode_conversation(model, body, body.messages, raw)
    stage, markers = chat_stage(model, body, prompt, tools)
    constraint = output_constraint(body, from_response_format, model.caps.schema_bytes)
    texts = await text_prompts(model, prompt)
    generation = generation_request(
        model, body, [prompt.ids], constraint=constraint, keep_special_token_ids=markers, texts=texts
    )
    writer = ChatWriter(envelope("chatcmpl-", model, body), choices=body.n, logprobs=body.logprobs)
    return await respond(model, body, generation, stage, writer, body.n)
