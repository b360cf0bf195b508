"""POST /v3/completions and /v1/completions."""

from __future__ import annotations

from typing import Any

from quart import Blueprint

from ovtrio.api.completions.scored import scored_completion
from ovtrio.api.completions.writer import CompletionWriter
from ovtrio.api.pipeline import accept, check_request_size, envelope, generation_request, respond
from ovtrio.api.protocol import CompletionRequest
from ovtrio.output import OutputStage

blueprint = Blueprint("completions", __name__)


@blueprint.post("/v3/completions")
@blueprint.post("/v1/completions")
async def create_completion() -> Any:
    body, model = await accept(CompletionRequest)
    check_request_size(model, body, _prompt_count(body.prompt))
    prompts = model.prompts.encode_completion_prompts(body.prompt)
    echo = model.prompts.prompt_texts(body.prompt, prompts) if body.echo else None
    generation = generation_request(model, body, prompts)
    choices = len(prompts) * body.n
    writer = CompletionWriter(
        envelope("cmpl-", model, body),
        choices=choices,
        n=body.n,
        echo=echo,
        logprobs=body.wants_logprobs(),
        top_logprobs=body.top_logprobs(),
        prompt_logprobs=body.prompt_logprobs,
        scored=body.scores_prompt(),
    )
    if body.needs_scoring() or body.max_tokens == 0:
        return await scored_completion(model, body, prompts, generation, writer, choices)
    stage = OutputStage(
        logprobs=model.prompts.output_bytes(body.skip_special_tokens) if body.wants_logprobs() else None
    )
    return await respond(model, body, generation, stage, writer, choices)


def _prompt_count(prompt: str | list[Any]) -> int:
    """How many prompts `prompt` holds: a string or one list of token ids is one."""
    if isinstance(prompt, str) or isinstance(prompt[0], int):
        return 1
    return len(prompt)
