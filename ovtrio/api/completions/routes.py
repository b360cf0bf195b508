"""POST /v3/completions and /v1/completions."""

from __future__ import annotations

from typing import Any

from quart import Blueprint

from ovtrio.api.completions.writer import CompletionWriter
from ovtrio.api.pipeline import accept, envelope, generation_request, respond
from ovtrio.api.protocol import CompletionRequest
from ovtrio.output import OutputStage

blueprint = Blueprint("completions", __name__)


@blueprint.post("/v3/completions")
@blueprint.post("/v1/completions")
async def create_completion() -> Any:
    body, model = await accept(CompletionRequest)
    prompts = model.prompts.encode_completion_prompts(body.prompt)
    echo = model.prompts.prompt_texts(body.prompt, prompts) if body.echo else None
    generation = generation_request(model, body, prompts)
    stage = OutputStage(logprobs=model.prompts.output_bytes(body.skip_special_tokens) if body.wants_logprobs() else None)
    choices = len(prompts) * body.n
    writer = CompletionWriter(
        envelope("cmpl-", model, body), choices=choices, n=body.n, echo=echo, logprobs=body.wants_logprobs()
    )
    return await respond(model, body, generation, stage, writer, choices)
