"""Sinks for a request's message stream: one unary JSON body, or SSE events.

Both read the same scheduler messages; a unary response is the aggregation of exactly
the deltas a stream would have sent.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from ovtrio.api.errors import APIError
from ovtrio.api.formatting import ChoiceOutput, Formatter
from ovtrio.scheduler import Completed, Delta, Failed, GenerationRequest, Message, RequestStream, Scheduler

DONE_EVENT = b"data: [DONE]\n\n"


def sse_event(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def engine_failure(failed: Failed) -> APIError:
    if failed.code == "out_of_memory":
        return APIError(503, failed.message, code="out_of_memory")
    return APIError(500, failed.message, code=failed.code)


async def unary_body(scheduler: Scheduler, request: GenerationRequest, formatter: Formatter) -> dict[str, Any]:
    outputs = [ChoiceOutput() for _ in range(formatter.choices)]
    async with scheduler.submit(request) as stream:
        while messages := await stream.receive_available():
            for message in messages:
                if isinstance(message, Delta):
                    output = outputs[message.index]
                    output.text += message.text
                    output.token_ids.extend(message.token_ids)
                    output.logprobs.extend(message.logprobs or ())
                    if message.finish_reason is not None:
                        output.finish_reason = message.finish_reason
                elif isinstance(message, Completed):
                    return formatter.unary(outputs, message)
                elif isinstance(message, Failed):
                    raise engine_failure(message)
    raise APIError(500, "the request ended without a result", code="engine_error")


class _Pending:
    """Deltas of one choice received together, merged into one chunk."""

    __slots__ = ("text", "token_ids", "logprobs")

    def __init__(self) -> None:
        self.text: list[str] = []
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []


class EventStream:
    """The SSE body of one streamed request.

    The request is submitted by `open()`, inside the handler, so that anything the
    engine refuses is still an ordinary HTTP error rather than a failure after the 200.
    Quart closes the body (`aclose`) however the response ends, including when the
    client disconnects and the sending task is cancelled; closing leaves the
    submission, and the scheduler cancels the engine request.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        request: GenerationRequest,
        formatter: Formatter,
        render: Callable[[RequestStream, Formatter], AsyncIterator[bytes]] | None = None,
    ) -> None:
        """`render` turns the request's messages into SSE frames: by default chat or
        completion chunks; the Responses API passes its event writer."""
        self._submission = scheduler.submit(request)
        self._render = render or _sse_events
        self._formatter = formatter
        self._events: AsyncIterator[bytes] | None = None
        self._closed = False

    async def open(self) -> "EventStream":
        """Submit the request; returns once the engine has it (or raises its refusal)."""
        stream = await self._submission.__aenter__()
        self._events = self._render(stream, self._formatter)
        return self

    def __aiter__(self) -> "EventStream":
        return self

    async def __anext__(self) -> bytes:
        assert self._events is not None, "EventStream.open() first"
        return await self._events.__anext__()

    async def aclose(self) -> None:
        if self._closed or self._events is None:
            return
        self._closed = True
        try:
            await self._events.aclose()  # type: ignore[attr-defined]
        finally:
            await self._submission.__aexit__(None, None, None)


async def _sse_events(stream: RequestStream, formatter: Formatter) -> AsyncIterator[bytes]:
    for chunk in formatter.opening_chunks():
        yield sse_event(chunk)
    while messages := await stream.receive_available():
        if frames := _frames(formatter, messages):
            yield b"".join(frames)
    yield DONE_EVENT


def _frames(formatter: Formatter, messages: list[Message]) -> list[bytes]:
    return [sse_event(chunk) for chunk in chunk_bodies(formatter, messages)]


def chunk_bodies(formatter: Formatter, messages: list[Message]) -> list[dict[str, Any]]:
    """The stream chunks for messages received together; the deltas of one choice that
    queued up while the client was slow go out as one chunk. An engine failure is an
    {"error": ...} body."""
    chunks: list[dict[str, Any]] = []
    pending: dict[int, _Pending] = {}
    for message in messages:
        if isinstance(message, Delta):
            if message.text or message.token_ids:
                merged = pending.setdefault(message.index, _Pending())
                merged.text.append(message.text)
                merged.token_ids.extend(message.token_ids)
                merged.logprobs.extend(message.logprobs or ())
            if message.finish_reason is not None:
                chunks.extend(_flush(formatter, pending))
                chunks.extend(formatter.finish_chunks(message.index, message.finish_reason))
        elif isinstance(message, Completed):
            chunks.extend(_flush(formatter, pending))
            if formatter.include_usage:
                chunks.append(formatter.chunk_usage(message))
        elif isinstance(message, Failed):
            chunks.extend(_flush(formatter, pending))
            chunks.append(engine_failure(message).body())
    chunks.extend(_flush(formatter, pending))
    return chunks


def _flush(formatter: Formatter, pending: dict[int, _Pending]) -> list[dict[str, Any]]:
    chunks = [
        chunk
        for index, p in pending.items()
        for chunk in formatter.text_chunks(index, "".join(p.text), p.token_ids, p.logprobs)
    ]
    pending.clear()
    return chunks
