"""A streamed transcription (`stream=true`): OpenAI's `transcript.text.delta` events as
the model writes, then `transcript.text.done` with the whole text and its usage.

The text comes from the worker thread: each piece is handed to the event loop
(`run_sync_soon`, which never waits) and queued for the response. The response body
waits for the next piece or for the job's end at once (`trio.as_safe_channel` keeps
that wait's nursery out of the body's generator). A body closed early (the client left)
gives the job up: it stops at its next token or window.
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator, Callable
from functools import partial
from typing import Any

import orjson
import trio
from quart import Response

from ovtrio.api.errors import APIError, api_error, shutting_down
from ovtrio.api.job_pieces import pieces_then_outcome
from ovtrio.api.sse import HEADERS
from ovtrio.audio import transcripts
from ovtrio.audio.decode import Audio
from ovtrio.audio.engine import Options, Transcript
from ovtrio.audio.service import TranscriptionService, TranscriptionWork
from ovtrio.embedding.worker import EncoderUnavailable, Job


def streamed(
    service: TranscriptionService,
    audio: Audio,
    options: Options,
    enqueue: Callable[[TranscriptionService, TranscriptionWork], Job],
) -> Response:
    """Admit the request (`enqueue` raises what refuses it), then answer with its events."""
    send, receive = trio.open_memory_channel[str](math.inf)
    token = trio.lowlevel.current_trio_token()

    def deliver(text: str) -> None:
        try:
            send.send_nowait(text)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass  # the stream has ended: its client left

    def on_text(text: str) -> None:  # in the worker thread
        try:
            token.run_sync_soon(deliver, text)
        except trio.RunFinishedError:
            pass

    job = enqueue(service, TranscriptionWork(audio, options, on_text))
    return Response(_TextEvents(service, job, send, receive), mimetype="text/event-stream", headers=HEADERS)


def unavailable(exc: EncoderUnavailable) -> APIError:
    if exc.code == "shutting_down":
        return shutting_down(cut=True)
    return APIError(503, str(exc), code=exc.code, retry_after=exc.retry_after)


def _frame(event: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(event) + b"\n\n"


class _TextEvents:
    """The SSE body of a streamed transcription: a delta event for each piece of text,
    then the done event (or an error event). Closed early (the client left), the job is
    given up: it stops at its next token or window."""

    def __init__(
        self,
        service: TranscriptionService,
        job: Job,
        send: trio.MemorySendChannel[str],
        receive: trio.MemoryReceiveChannel[str],
    ) -> None:
        self._job = job
        self._events = self._frames(service, job, send, receive)

    def __aiter__(self) -> _TextEvents:
        return self

    async def __anext__(self) -> bytes:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        self._job.abandoned = True
        await self._events.aclose()

    async def _frames(
        self,
        service: TranscriptionService,
        job: Job,
        send: trio.MemorySendChannel[str],
        receive: trio.MemoryReceiveChannel[str],
    ) -> AsyncGenerator[bytes, None]:
        pieces: trio.abc.ReceiveChannel[str | Transcript | Exception]
        async with pieces_then_outcome(partial(service.result, job), send, receive) as pieces:
            async for piece in pieces:
                if isinstance(piece, str):
                    yield _frame({"type": "transcript.text.delta", "delta": piece})
                elif isinstance(piece, Transcript):
                    usage = transcripts.token_usage(piece, piece.windows * service.audio_tokens)
                    yield _frame({"type": "transcript.text.done", "text": piece.text, "usage": usage})
                else:
                    error = unavailable(piece) if isinstance(piece, EncoderUnavailable) else api_error(piece)
                    yield _frame(error.body())
