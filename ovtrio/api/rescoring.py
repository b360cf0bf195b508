"""What completions and chat share to give log-probabilities the engine does not report:
a generation's events collected whole, sequences scored on the scoring path
(ovtrio/scoring) with its refusals as 400s naming the field, the scoring pass's figures
written into the generated tokens' entries, and the collected events written out,
unary or as one stream."""

from __future__ import annotations

from typing import Any, Protocol

from quart import Response

from ovtrio.api.errors import invalid
from ovtrio.api.generation import run_to_end
from ovtrio.api.protocol import SamplingFields
from ovtrio.api.sse import DONE, HEADERS, data_frame, joined
from ovtrio.output import (
    Outcome,
    OutputEvent,
    OutputStage,
    ResultCollector,
    TextDelta,
    TokenLogprob,
    TopLogprob,
)
from ovtrio.scheduler import GenerationRequest
from ovtrio.scoring import ScoringUnavailable, SequenceScores
from ovtrio.serving.service import ServingModel
from ovtrio.text.prompts import PromptBuilder


class EventWriter(Protocol):
    def opening(self) -> list[dict[str, Any]]: ...

    def write(self, events: list[OutputEvent]) -> list[dict[str, Any]]: ...

    def completion(self, outcome: Outcome) -> dict[str, Any]: ...


async def generated_events(model: ServingModel, generation: GenerationRequest, stage: OutputStage) -> list[OutputEvent]:
    """Every event of the generation, once it has ended (a failure is the request's error)."""
    events: list[OutputEvent] = []
    await run_to_end(model.scheduler, generation, stage, events.extend)
    return events


def generated_entries(events: list[OutputEvent], choices: int) -> list[list[TokenLogprob]]:
    """Each choice's generated tokens' entries, in order (every generated token has one
    when log-probabilities were asked for)."""
    entries: list[list[TokenLogprob]] = [[] for _ in range(choices)]
    for event in events:
        if isinstance(event, TextDelta) and event.logprobs:
            entries[event.choice] += event.logprobs
    return entries


async def scored_sequences(
    model: ServingModel, sequences: list[list[int]], top: int, param: str
) -> list[SequenceScores]:
    """Each sequence scored on the scoring path with its `top` most likely tokens; a 400
    naming `param` where the scoring path cannot run."""
    scorer = model.scorer
    try:
        if scorer is None:
            raise ScoringUnavailable("this server's engine backend has no scoring path")
        return await scorer.score(sequences, top)
    except ScoringUnavailable as exc:
        raise invalid(
            f"The log-probabilities asked for need the scoring path, which cannot run here: {exc}.",
            param,
            "unsupported_parameter",
        ) from None


def fill_generated(
    model: ServingModel, prompts: list[list[int]], generated: list[list[TokenLogprob]], scores: list[SequenceScores]
) -> None:
    """Write the scoring pass's figures into each choice's generated entries (choice i's
    sequence was prompts[i] followed by its generated tokens)."""
    for prompt, entries, scored in zip(prompts, generated, scores):
        for position, entry in enumerate(entries, start=len(prompt)):
            fill(entry, scored, position, model.prompts)


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


def respond_with_events(body: SamplingFields, writer: EventWriter, events: list[OutputEvent], choices: int) -> Any:
    """The collected events written out: one SSE body of all the chunks, or the unary body."""
    if body.stream:
        bodies = writer.opening() + writer.write(events)
        return Response(joined(data_frame, bodies) + DONE, mimetype="text/event-stream", headers=HEADERS)
    outcome = ResultCollector(choices).add(events)
    assert isinstance(outcome, Outcome), "the events end with the request's Completed"
    return writer.completion(outcome)
