"""Running a prepared response, one way for HTTP (streamed or unary) and the WebSocket:
its output events laid out by ResponseEvents, and a completed response stored before
the client hears that it ended, so that a continuation sent the moment the client has
the final event always finds it.

What is stored is the Response as the client got it, the request's input items, and the
conversation a continuation starts from: the earlier turns, this input, and this
response's answer, taken from its typed outcome (each choice's text, then its tool
calls), not read back from the Response it was written into.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Sequence

from pydantic_core import to_jsonable_python

from ovtrio.api.generation import run_to_end, written
from ovtrio.api.protocol import ChatMessage, FunctionCall, ToolCallRef
from ovtrio.api.responses.body import Response
from ovtrio.api.responses.events import ResponseEvents
from ovtrio.api.responses.objects import StreamEvent
from ovtrio.api.responses.prepare import PreparedResponse
from ovtrio.api.responses.store import ResponseStore, StoredResponse
from ovtrio.output import Outcome
from ovtrio.parsing.ids import new_id
from ovtrio.scheduler import GenerationScheduler, RequestStream


async def response_events(
    stream: RequestStream, ready: PreparedResponse, writer: ResponseEvents, stores: Sequence[ResponseStore]
) -> AsyncIterator[list[StreamEvent]]:
    """The writer's events in batches, as the engine produces them. A response that
    completed is kept in `stores` before the batch that says so is handed on."""
    stored = False
    async for events in written(stream, ready.stage, writer):
        if writer.final is not None and writer.outcome is not None and not stored:
            stored = True
            await store_response(stores, ready, writer.final, writer.outcome)
        yield events


async def unary_response(
    scheduler: GenerationScheduler, ready: PreparedResponse, stores: Sequence[ResponseStore]
) -> Response:
    """Run the request to its end: the Response its events end with (unsent)."""
    writer = ResponseEvents(ready.envelope, ready.body.n)
    await run_to_end(scheduler, ready.generation, ready.stage, writer.write)
    assert writer.final is not None and writer.outcome is not None, "a completed request has its Response"
    await store_response(stores, ready, writer.final, writer.outcome)
    return writer.final


async def store_response(
    stores: Sequence[ResponseStore], ready: PreparedResponse, response: Response, outcome: Outcome
) -> None:
    if not stores:
        return
    turns = [*ready.previous, *ready.body.input_messages(), *answer(outcome)]
    items = [
        {"id": item.id or new_id("msg_"), **item.model_dump(exclude_none=True, exclude={"id"})}
        for item in ready.body.items()
    ]
    entry = StoredResponse(to_jsonable_python(response), items, [turn.model_dump(exclude_none=True) for turn in turns])
    for store in stores:
        await store.put(dataclasses.replace(entry))


def answer(outcome: Outcome) -> list[ChatMessage]:
    """A response's answer as chat messages, as its output items lay it out: each
    choice's text as an assistant message (an empty one if it wrote nothing else), its
    tool calls as an assistant message that makes them."""
    messages: list[ChatMessage] = []
    for result in outcome.choices:
        if result.text or not result.tool_calls:
            messages.append(ChatMessage(role="assistant", content=result.text))
        calls = [
            ToolCallRef(id=call.id, function=FunctionCall(name=call.name, arguments=call.arguments))
            for call in result.tool_calls
        ]
        if not calls:
            continue
        if messages and messages[-1].tool_calls is not None:
            messages[-1].tool_calls.extend(calls)
        else:
            messages.append(ChatMessage(role="assistant", tool_calls=calls))
    return messages
