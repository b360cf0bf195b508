"""Sinks for a request's message stream: one unary JSON body, or SSE events.

Both read the same scheduler messages; a unary response is the aggregation of exactly
the deltas a stream would have sent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from ovtrio.api.errors import APIError
from ovtrio.api.formatting import ChoiceOutput, Formatter
from ovtrio.scheduler import Completed, Delta, Failed, GenerationRequest, Message, Scheduler

DONE_EVENT = b"data: [DONE]\n\n"

log = logging.getLogger("ovtrio")


def sse_event(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def engine_failure(failed: Failed) -> APIError:
    if failed.code == "out_of_memory":
        return APIError(503, failed.message, code="out_of_memory")
    return APIError(500, failed.message, code=failed.code)


async def unary_body(scheduler: Scheduler, request: GenerationRequest, formatter: Formatter) -> dict[str, Any]:
    outputs = [ChoiceOutput() for _ in range(formatter.choices)]
    with scheduler.submit(request) as stream:
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


async def sse_events(scheduler: Scheduler, request: GenerationRequest, formatter: Formatter) -> AsyncIterator[bytes]:
    """SSE frames for one request. The engine request lives exactly as long as this
    generator runs: when the client leaves, the sending task is cancelled, the `with`
    block exits, and the scheduler cancels the engine request."""
    try:
        with scheduler.submit(request) as stream:
            for chunk in formatter.opening_chunks():
                yield sse_event(chunk)
            while messages := await stream.receive_available():
                if frames := _frames(formatter, messages):
                    yield b"".join(frames)
    except Exception:  # the engine refused the request after the 200 went out
        log.exception("streamed request failed")
        yield sse_event(APIError(500, "The engine could not run this request.", code="engine_error").body())
    yield DONE_EVENT


def _frames(formatter: Formatter, messages: list[Message]) -> list[bytes]:
    """The SSE frames for messages received together; the deltas of one choice that
    queued up while the client was slow go out as one chunk."""
    frames: list[bytes] = []
    pending: dict[int, _Pending] = {}
    for message in messages:
        if isinstance(message, Delta):
            if message.text or message.token_ids:
                merged = pending.setdefault(message.index, _Pending())
                merged.text.append(message.text)
                merged.token_ids.extend(message.token_ids)
                merged.logprobs.extend(message.logprobs or ())
            if message.finish_reason is not None:
                frames.extend(_flush(formatter, pending))
                frames.append(sse_event(formatter.chunk_finish(message.index, message.finish_reason)))
        elif isinstance(message, Completed):
            frames.extend(_flush(formatter, pending))
            if formatter.include_usage:
                frames.append(sse_event(formatter.chunk_usage(message)))
        elif isinstance(message, Failed):
            frames.extend(_flush(formatter, pending))
            frames.append(sse_event(engine_failure(message).body()))
    frames.extend(_flush(formatter, pending))
    return frames


def _flush(formatter: Formatter, pending: dict[int, _Pending]) -> list[bytes]:
    frames = [
        sse_event(formatter.chunk_text(index, "".join(p.text), p.token_ids, p.logprobs))
        for index, p in pending.items()
        if "".join(p.text) or formatter.logprobs
    ]
    pending.clear()
    return frames
