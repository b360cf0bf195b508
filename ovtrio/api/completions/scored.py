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

from quart import Response

from ovtrio.api.completions.writer import CompletionWriter
from ovtrio.api.errors import api_error, invalid
from ovtrio.api.pipeline import submitted
from ovtrio.api.protocol import CompletionRequest
from ovtrio.api.sse import DONE, HEADERS, data_frame, joined
from ovtrio.model.prompts import PromptBuilder
from ovtrio.output import (
    ChoiceFinished,
    OutputEvent,
    OutputStage,
    PromptScored,
    ResultCollector,
    TextDelta,
    TokenLogprob,
    TopLogprob,
)
from ovtrio.scheduler import Completed, Failed, GenerationRequest
from ovtrio.scoring import ScoringUnavailable, SequenceScores
from ovtrio.service import ServingModel


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
        events = await _generated(model, body, generation, choices)
    else:
        events = [ChoiceFinished(choice, "length") for choice in range(choices)]
        events.append(Completed(sum(len(p) for p in prompts), 0))
    generated: list[list[TokenLogprob]] = [[] for _ in range(choices)]
    for event in events:
        if isinstance(event, TextDelta) and event.logprobs:
            generated[event.choice] += event.logprobs
    rescored = generates and body.top_logprobs() > 0
    sequences = [
        prompts[choice // body.n] + ([entry.token_id for entry in generated[choice]] if rescored else [])
        for choice in range(choices)
    ]
    scores = await _scores(model, body, sequences) if body.needs_scoring() else []
    leading: list[OutputEvent] = []
    if body.scores_prompt():
        texts = model.prompts.prompt_texts(body.prompt, prompts)
        for choice in range(choices):
            prompt = prompts[choice // body.n]
            leading.append(PromptScored(choice, prompt_entries(model.prompts, prompt, texts[choice // body.n], scores[choice])))
    if rescored:
        for choice in range(choices):
            offset = len(prompts[choice // body.n])
            for position, entry in enumerate(generated[choice], start=offset):
                fill(entry, scores[choice], position, model.prompts)
    events = leading + events
    if body.stream:
        bodies = writer.opening() + writer.write(events)
        return Response(joined(data_frame, bodies) + DONE, mimetype="text/event-stream", headers=HEADERS)
    outcome = ResultCollector(choices).add(events)
    assert outcome is not None and not isinstance(outcome, Failed)
    return writer.completion(outcome)


async def _scores(model: ServingModel, body: CompletionRequest, sequences: list[list[int]]) -> list[SequenceScores]:
    scorer = model.scorer
    try:
        if scorer is None:
            raise ScoringUnavailable("this server's engine backend has no scoring path")
        return await scorer.score(sequences, max(body.top_logprobs(), body.prompt_logprobs or 0))
    except ScoringUnavailable as exc:
        raise invalid(
            f"The log-probabilities asked for need the scoring path, which cannot run here: {exc}.",
            scoring_param(body),
            "unsupported_parameter",
        ) from None


async def _generated(model: ServingModel, body: CompletionRequest, generation: GenerationRequest, choices: int) -> list[OutputEvent]:
    """Every event of the generation, once it has ended."""
    stage = OutputStage(logprobs=model.prompts.output_bytes(body.skip_special_tokens) if body.wants_logprobs() else None)
    events: list[OutputEvent] = []
    async with submitted(model.scheduler, generation) as stream:
        while messages := await stream.receive_available():
            for event in stage.feed(messages):
                if isinstance(event, Failed):
                    raise api_error(event)
                events.append(event)
                if isinstance(event, Completed):
                    return events
    raise api_error(Failed("the request ended without a result", "engine_error"))


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


def fill(entry: TokenLogprob, scores: SequenceScores, position: int, prompts: PromptBuilder) -> None:
    """Set `entry`'s log-probability, rank and most likely tokens from the scoring pass."""
    if position == 0:
        entry.logprob, entry.rank, entry.top = None, None, None
        return
    entry.logprob = scores.logprob(position)
    entry.rank = int(scores.ranks[position])
    entry.top = [top_logprob(prompts, token_id, value) for token_id, value in scores.top(position)]


def top_logprob(prompts: PromptBuilder, token_id: int, value: float) -> TopLogprob:
    data = prompts.token_bytes(token_id)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = "bytes:" + "".join(f"\\x{byte:02x}" for byte in data)
    return TopLogprob(token_id, data, text, value)
