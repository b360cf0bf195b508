"""POST /v3/completions and /v1/completions."""

from __future__ import annotations

from typing import Any

from quart import Blueprint

from ovtrio.api.chunks import Envelope
from ovtrio.api.completions.writer import CompletionWriter
from ovtrio.api.context import ready_model
from ovtrio.api.pipeline import check_model, event_stream, generation_request, include_usage, parse_body, unary_outcome
from ovtrio.api.protocol import CompletionRequest
from ovtrio.ids import new_id
from ovtrio.output import OutputStage

blueprint = Blueprint("completions", __name__)


@blueprint.post("/v3/completions")
@blueprint.post("/v1/completions")
async def create_completion() -> Any:
    body = await parse_body(CompletionRequest)
    model = ready_model()
    check_model(model, body)
    prompts = model.prompts.encode_completion_prompts(body.prompt)
    echo = model.prompts.prompt_texts(body.prompt, prompts) if body.echo else None
    generation = generation_request(model, body, prompts)
    stage = OutputStage(logprobs=model.prompts.token_bytes if body.wants_logprobs() else None)
    choices = len(prompts) * body.n
    envelope = Envelope(new_id("cmpl-"), model.name, model.system_fingerprint, include_usage(body))
    writer = CompletionWriter(envelope, choices=choices, n=body.n, echo=echo, logprobs=body.wants_logprobs())
    if body.stream:
        return event_stream(model, generation, stage, writer)
    return writer.completion(await unary_outcome(model, generation, stage, choices))
