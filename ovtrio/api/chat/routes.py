"""POST /v3/chat/completions and /v1/chat/completions."""

from __future__ import annotations

from typing import Any

from quart import Blueprint

from ovtrio.api.chat.writer import ChatWriter
from ovtrio.api.conversation import chat_stage, encode_conversation, forced, output_constraint
from ovtrio.api.formats import from_response_format
from ovtrio.api.generation import accept, envelope, generation_request, respond
from ovtrio.api.protocol import ChatCompletionRequest
from ovtrio.api.rescoring import (
    fill_generated,
    generated_entries,
    generated_events,
    respond_with_events,
    scored_sequences,
)
from ovtrio.api.vision import text_prompts
from ovtrio.output import OutputStage
from ovtrio.scheduler import GenerationRequest
from ovtrio.serving.service import ServingModel

blueprint = Blueprint("chat", __name__)


@blueprint.post("/v3/chat/completions")
@blueprint.post("/v1/chat/completions")
async def create_chat_completion() -> Any:
    body, model = await accept(ChatCompletionRequest)
    raw = bool(body.nvext and body.nvext.use_raw_prompt)
    prompt, tools = await encode_conversation(model, body, body.messages, raw)
    stage, markers = chat_stage(model, body, prompt, tools)
    constraint = await output_constraint(body, from_response_format, model.caps.schema_bytes)
    texts = await text_prompts(model, prompt)
    generation = generation_request(
        model, body, [prompt.ids], constraint=constraint, keep_special_token_ids=markers, texts=texts
    )
    writer = ChatWriter(
        envelope("chatcmpl-", model, body), choices=body.n, logprobs=body.logprobs, calls_forced=forced(body)
    )
    if body.logprobs and body.top_logprobs:
        return await _with_top_logprobs(model, body, prompt.ids, generation, stage, writer)
    return await respond(model, body, generation, stage, writer, body.n)


async def _with_top_logprobs(
    model: ServingModel,
    body: ChatCompletionRequest,
    prompt_ids: list[int],
    generation: GenerationRequest,
    stage: OutputStage,
    writer: ChatWriter,
) -> Any:
    """The engine reports the chosen token's log-probability only: once the choices are
    complete, the scoring path scores the prompt and each choice's tokens, and its
    figures fill every entry (so a streamed request gets its chunks at the end)."""
    assert body.top_logprobs is not None
    events = await generated_events(model, generation, stage)
    generated = generated_entries(events, body.n)
    sequences = [prompt_ids + [entry.token_id for entry in entries] for entries in generated]
    scores = await scored_sequences(model, sequences, body.top_logprobs, "top_logprobs")
    fill_generated(model, [prompt_ids] * body.n, generated, scores)
    return respond_with_events(body, writer, events, body.n)
