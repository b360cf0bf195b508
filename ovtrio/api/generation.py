"""How a generation request is taken in, run and answered: the path every generation
endpoint shares (and `parse_body`, which every endpoint with a body uses).

A handler takes its validated body and the ready model (`accept`, which also refuses the
request with a 429 when the scheduler is full, before anything is tokenized), builds its
prompt, then `generation_request` checks the request's size and the sampling settings
against the model's limits: all before the client is answered 200. The request then runs in the scheduler, and its
outputs pass through an OutputStage into a writer: `unary_outcome` aggregates them for
one JSON body, `event_stream` streams them as server-sent events (`respond` picks
one for chat and completions).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any, Protocol, Self, TypeVar

import trio
from pydantic import ValidationError
from quart import Response, request

from ovtrio.api.capabilities import check_capabilities, check_constraint, check_prompt_length
from ovtrio.api.chunks import Envelope
from ovtrio.api.context import generation_model, model_registry
from ovtrio.api.errors import SHUTDOWN_RETRY_AFTER, APIError, api_error, from_validation_error, invalid
from ovtrio.api.lifted_strings import lift_data_urls
from ovtrio.api.protocol import SamplingFields
from ovtrio.api.sampling import sampling_params
from ovtrio.api.sse import DONE, EventStream, data_frame, joined, sse_response
from ovtrio.output import Outcome, OutputEvent, OutputStage, ResultCollector
from ovtrio.parsing.ids import new_id
from ovtrio.scheduler import (
    Completed,
    Failed,
    GenerationRequest,
    GenerationScheduler,
    NotAccepting,
    OutputConstraint,
    RequestStream,
    TextPrompt,
    UnsupportedParams,
    sequences_per_prompt,
)
from ovtrio.serving.residency import MODEL_UNLOADED
from ovtrio.serving.service import ServingModel


class JsonBody(Protocol):
    """A request body's model: pydantic's, read from JSON."""

    @classmethod
    def model_validate_json(cls, json_data: str | bytes | bytearray) -> Self: ...


class NamesAModel(JsonBody, Protocol):
    """A request body that names the model it is for."""

    model: str


Body = TypeVar("Body", bound=JsonBody)
Routed = TypeVar("Routed", bound=NamesAModel)


Written = TypeVar("Written")  # what a writer writes: dicts for chunks, typed events


class Writer(Protocol[Written]):
    """Writes one response's bodies (chunks or events) from its output events."""

    def opening(self) -> list[Written]: ...

    def write(self, events: list[OutputEvent]) -> list[Written]: ...


# Bodies this large take milliseconds to parse, on the event loop: pydantic holds the GIL
# throughout, so a thread would not free it (see docs/benchmarks.md#request-bodies).
# Their data URLs (images) are lifted out before parsing (lifted_strings.py, which also
# decides from what size a body is worth searching).
LARGE_BODY_BYTES = 1024 * 1024
# One large body parsed at a time: requests whose bodies arrive together would otherwise
# be parsed one after the other in one pass of trio's run loop, before it reads any
# socket (see docs/benchmarks.md#request-bodies). Each waiter is woken into the
# next pass, so the loop serves its sockets between two of them.
_LARGE_BODY_PARSE = trio.Lock()


async def parse_body(model_type: type[Body]) -> Body:
    raw = await request.get_data(as_text=False)
    assert isinstance(raw, (bytes, bytearray))  # as_text=False (a bytearray: request_body.py)
    try:
        lifted = await lift_data_urls(raw)
        body = await _validated(model_type, lifted.json)
        if not lifted.restore(body):  # a lifted string outside an image's field: every check, on the whole
            body = await _validated(model_type, raw)
    except ValidationError as exc:
        raise from_validation_error(exc) from None
    return body


async def _validated(model_type: type[Body], json: bytes | bytearray | str) -> Body:
    if len(json) <= LARGE_BODY_BYTES:
        return model_type.model_validate_json(json)
    async with _LARGE_BODY_PARSE:
        await trio.lowlevel.checkpoint()
        return model_type.model_validate_json(json)


async def accept(model_type: type[Routed]) -> tuple[Routed, ServingModel]:
    """The request's body, validated, and the ready model it names (a 404 for a model the
    server does not serve), which has room for it (Overloaded otherwise: a 429)."""
    body = await parse_body(model_type)
    model = await generation_model(body.model, getattr(body, "keep_alive", None))
    model.scheduler.check_capacity()
    return body, model


def check_request_size(model: ServingModel, body: SamplingFields, prompts: int) -> None:
    """Refuse a request of more prompts, or more choices (n x prompts), than the server
    allows one request, or fields its engine backend cannot serve: checked before the
    prompts are tokenized."""
    check_capabilities(model.capabilities, body, prompts)
    caps = model.caps
    stops = body.stop_strings()
    if len(stops) > caps.stop_strings:
        raise invalid(
            f"Invalid value for 'stop': this server takes at most {caps.stop_strings} stop strings, and this"
            f" request has {len(stops)}.",
            "stop",
            "invalid_value",
        )
    if prompts > caps.prompts:
        raise invalid(
            f"Invalid value for 'prompt': this server takes at most {caps.prompts} prompts in one request,"
            f" and this one has {prompts}.",
            "prompt",
            "too_many_prompts",
        )
    choices = prompts * sequences_per_prompt(body.n, body.beam_width())
    if choices > caps.choices:
        what = f"{prompts} prompts x n={body.n}" if prompts > 1 else f"n={body.n}"
        if body.beam_width() > body.n:
            what += f" (best_of={body.beam_width()})"
        raise invalid(
            f"Invalid value for 'n': this server runs at most {caps.choices} choices (n x prompts) for one"
            f" request, and this one asks for {choices} ({what}).",
            "n",
            "too_many_choices",
        )


def generation_request(
    model: ServingModel,
    body: SamplingFields,
    prompts: list[list[int]],
    *,
    constraint: OutputConstraint | None = None,
    keep_special_token_ids: frozenset[int] = frozenset(),
    texts: list[TextPrompt] | None = None,
) -> GenerationRequest:
    """The scheduler's request: what the backend can do, size and sampling settings
    checked, plus the tokenized prompts (and `texts`, what a vision-language model's
    engine is given instead: see GenerationRequest)."""
    check_request_size(model, body, len(prompts))
    check_constraint(model.capabilities, body, constraint)
    check_prompt_length(model.capabilities, body, prompts)
    longest = max(len(p) for p in prompts)
    # The engine indexes the logits and the grammar's token mask with each stop id, in a
    # step that cannot raise: an id outside the vocabulary is refused here.
    model.prompts.checked_ids(list(body.stop_token_ids or ()), "stop_token_ids")
    # A prompt beyond the context is refused as such first (context_length_exceeded).
    params = sampling_params(body, longest, model.sequence_limit, model.defaults, constraint)
    total = sum(len(p) for p in prompts)
    if total > model.caps.prompt_tokens:
        raise invalid(
            f"Invalid value for '{body.prompt_field}': this server takes at most {model.caps.prompt_tokens} prompt"
            f" tokens in one request, and this one has {total}.",
            body.prompt_field,
            "too_many_prompt_tokens",
        )
    if keep_special_token_ids:
        params = replace(params, keep_special_token_ids=keep_special_token_ids)
    return GenerationRequest(prompts, params, texts)


@asynccontextmanager
async def submitted(scheduler: GenerationScheduler, generation: GenerationRequest) -> AsyncIterator[RequestStream]:
    """`scheduler.submit`, naming the request field at fault when the engine refuses the
    request as it is added (an output constraint it cannot compile)."""
    entered = False
    try:
        async with scheduler.submit(generation) as stream:
            entered = True
            yield stream
    except UnsupportedParams as exc:
        if entered or exc.param is not None:
            raise
        param = "response_format" if generation.params.constraint is not None else None
        raise UnsupportedParams(str(exc), param) from None
    except NotAccepting:
        if model_registry().shutdown.draining.is_set():
            raise
        # The model's unload waited the drain timeout for this request's lease and went on.
        raise APIError(
            503,
            "The model was unloaded before this request reached it (its unload waits for the requests that"
            " hold it up to the drain timeout); retry it (it loads again).",
            code=MODEL_UNLOADED,
            retry_after=SHUTDOWN_RETRY_AFTER,
        ) from None


async def written(stream: RequestStream, stage: OutputStage, writer: Writer[Written]) -> AsyncIterator[list[Written]]:
    """The writer's bodies for one request, in batches as the engine produces them."""
    if opening := writer.opening():
        yield opening
    while outputs := await stream.receive_available():
        if bodies := writer.write(stage.feed(outputs)):
            yield bodies


async def event_stream(
    model: ServingModel,
    generation: GenerationRequest,
    stage: OutputStage,
    writer: Writer[dict[str, Any]],
) -> Response:
    """The writer's chat or completion chunks as data-only server-sent events (the
    Responses API's named events are streamed by ovtrio/api/responses/running.py)."""

    async def frames(stream: RequestStream) -> AsyncGenerator[bytes, None]:
        async for bodies in written(stream, stage, writer):
            yield joined(data_frame, bodies)
        yield DONE

    return sse_response(await EventStream(submitted(model.scheduler, generation), frames).open())


async def run_to_end(
    scheduler: GenerationScheduler,
    generation: GenerationRequest,
    stage: OutputStage,
    consume: Callable[[list[OutputEvent]], object],
) -> Completed:
    """Run a request to its end, handing each batch of its output events to `consume` as
    the engine produces them (so a unary reply is built as it goes, as a stream would
    be). Returns its usage; a request that failed raises its error, after `consume` has
    seen the Failed."""
    async with submitted(scheduler, generation) as stream:
        while outputs := await stream.receive_available():
            events = stage.feed(outputs)
            consume(events)
            ended = events[-1] if events else None  # Completed or Failed comes last
            if isinstance(ended, Failed):
                raise api_error(ended)
            if isinstance(ended, Completed):
                return ended
    raise APIError(500, "the request ended without a result", code="engine_error")


async def unary_outcome(
    model: ServingModel, generation: GenerationRequest, stage: OutputStage, choices: int
) -> Outcome:
    """Run the request to its end and aggregate its events."""
    collector = ResultCollector(choices)
    usage = await run_to_end(model.scheduler, generation, stage, collector.add)
    return Outcome(collector.choices, usage)


def envelope(id_prefix: str, model: ServingModel, body: SamplingFields) -> Envelope:
    """What every chunk of the response shares; the last streamed one may carry usage."""
    include_usage = bool(body.stream and body.stream_options and body.stream_options.include_usage)
    return Envelope(new_id(id_prefix), model.name, model.system_fingerprint, include_usage)


class ChunkWriter(Writer[dict[str, Any]], Protocol):
    def completion(self, outcome: Outcome) -> dict[str, Any]: ...


async def respond(
    model: ServingModel,
    body: SamplingFields,
    generation: GenerationRequest,
    stage: OutputStage,
    writer: ChunkWriter,
    choices: int,
) -> Any:
    """Chat and completions: the stream of chunks, or the unary body."""
    if body.stream:
        return await event_stream(model, generation, stage, writer)
    return writer.completion(await unary_outcome(model, generation, stage, choices))
