"""POST /v3/completions and /v1/completions."""

from __future__ import annotations

from typing import Any

from quart import Blueprint

from ovtrio.api.completions.scored import scored_completion
from ovtrio.api.completions.writer import CompletionWriter
from ovtrio.api.errors import invalid
from ovtrio.api.generation import accept, check_request_size, envelope, generation_request, respond
from ovtrio.api.protocol import CompletionRequest
from ovtrio.api.text_limits import check_prompt_chars, tokenized
from ovtrio.output import OutputStage
from ovtrio.scheduler import TextPrompt
from ovtrio.serving.service import ServingModel

blueprint = Blueprint("completions", __name__)


@blueprint.post("/v3/completions")
@blueprint.post("/v1/completions")
async def create_completion() -> Any:
    body, model = await accept(CompletionRequest)
    check_request_size(model, body, _prompt_count(body.prompt))
    texts = _prompt_texts(body.prompt)
    for text in texts:
        check_prompt_chars(model, [text], "prompt")
    chars = sum(len(text) for text in texts)
    prompts = await tokenized(chars, model.prompts.encode_completion_prompts, body.prompt)
    echo = model.prompts.prompt_texts(body.prompt, prompts) if body.echo else None
    generation = generation_request(model, body, prompts, texts=_text_prompts(model, body.prompt))
    choices = generation.choices
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


def _text_prompts(model: ServingModel, prompt: str | list[Any]) -> list[TextPrompt] | None:
    """The prompts as text, for a model whose engine takes text only (a vision-language
    model's); it cannot take prompts sent as token ids."""
    if model.capabilities.token_prompts:
        return None
    if isinstance(prompt, str):
        return [TextPrompt(prompt)]
    if all(isinstance(item, str) for item in prompt):
        return [TextPrompt(text) for text in prompt]
    raise invalid(
        "This model takes prompts as text: its engine (a vision-language model's) cannot be given token ids.",
        "prompt",
        "unsupported_parameter",
    )


def _prompt_texts(prompt: str | list[Any]) -> list[str]:
    """The prompts sent as text (token ids are counted by the token limits)."""
    if isinstance(prompt, str):
        return [prompt]
    return [item for item in prompt if isinstance(item, str)]


def _prompt_count(prompt: str | list[Any]) -> int:
    """How many prompts `prompt` holds: a string or one list of token ids is one."""
    if isinstance(prompt, str) or isinstance(prompt[0], int):
        return 1
    return len(prompt)
