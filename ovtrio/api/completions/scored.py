"""Completions that need the scoring path (ovtrio/scoring): the prompt's log-probabilities
(`echo` with `logprobs`, `prompt_logprobs`), or the most likely tokens at each generated
position (`logprobs` > 0), which the engine does not report.

The engine generates as usual, prefix cache and all (with `max_tokens: 0` it is not
asked at all); then the scoring path runs the model over each choice's prompt, followed
by its generated tokens when their alternatives are wanted, in one pass, and reads every
position's distribution. Its figures fill the prompt's entries and replace the generated
tokens' (so a token's `token_logprobs` value and its value in `top_logprobs` are one
figure). The events then go to the writer as a generation's would, the prompt's first:
unary, or as a stream, written once all of it is known.
"""

from __future__ import annotations

import codecs
from typing import Any

from ovtrio.api.completions.writer import CompletionWriter
from ovtrio.api.protocol import CompletionRequest
from ovtrio.api.rescoring import (
    fill,
    fill_generated,
    generated_entries,
    generated_events,
    respond_with_events,
    scored_sequences,
)
from ovtrio.output import (
    ChoiceFinished,
    OutputEvent,
    OutputStage,
    PromptScored,
    TokenLogprob,
)
from ovtrio.scheduler import Completed, GenerationRequest
from ovtrio.scoring import SequenceScores
from ovtrio.serving.service import ServingModel
from ovtrio.text.prompts import PromptBuilder


def scoring_param(body: CompletionRequest) -> str:
    """The field that asked for the scoring path, for a refusal."""
    if body.prompt_logprobs is not None:
        return "prompt_logprobs"
    return "logprobs"


async def scored_completion(
    model: ServingModel,
    body: CompletionRequest,
    prompts: list[list[int]],
    generation: GenerationRequest,
    writer: CompletionWriter,
    choices: int,
) -> Any:
    generates = body.max_tokens != 0
    if generates:
        stage = OutputStage(
            logprobs=model.prompts.output_bytes(body.skip_special_tokens) if body.wants_logprobs() else None
        )
        events = await generated_events(model, generation, stage)
    else:
        events = [ChoiceFinished(choice, "length") for choice in range(choices)]
        events.append(Completed(sum(len(p) for p in prompts), 0))
    generated = generated_entries(events, choices)
    rescored = generates and body.top_logprobs() > 0
    sequences = [
        prompts[choice // body.n] + ([entry.token_id for entry in generated[choice]] if rescored else [])
        for choice in range(choices)
    ]
    top = max(body.top_logprobs(), body.prompt_logprobs or 0)
    scores = await scored_sequences(model, sequences, top, scoring_param(body)) if body.needs_scoring() else []
    leading: list[OutputEvent] = []
    if body.scores_prompt():
        texts = model.prompts.prompt_texts(body.prompt, prompts)
        for choice in range(choices):
            prompt = prompts[choice // body.n]
            leading.append(
                PromptScored(choice, prompt_entries(model.prompts, prompt, texts[choice // body.n], scores[choice]))
            )
    if rescored:
        fill_generated(model, [prompts[choice // body.n] for choice in range(choices)], generated, scores)
    return respond_with_events(body, writer, leading + events, choices)


def prompt_entries(prompts: PromptBuilder, ids: list[int], text: str, scores: SequenceScores) -> list[TokenLogprob]:
    """The prompt's entries: each token's piece of `text` (so they join to it exactly,
    special tokens included), its log-probability, rank and the most likely tokens."""
    utf8 = codecs.getincrementaldecoder("utf-8")("replace")
    entries = []
    for position, (token_id, piece) in enumerate(zip(ids, prompts.prompt_pieces(ids, text))):
        entry = TokenLogprob(piece, None, utf8.decode(piece), token_id)
        fill(entry, scores, position, prompts)
        entries.append(entry)
    return entries
