"""An encoder job's pieces as its worker sends them, then its outcome: what a streamed
transcription (text as each window is read) and a streamed speech (audio as each
sentence is spoken) both write from."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TypeVar

import trio

Piece = TypeVar("Piece")
Result = TypeVar("Result")


@trio.as_safe_channel
async def pieces_then_outcome(
    result: Callable[[], Awaitable[Result]],
    send: trio.MemorySendChannel[Piece],
    receive: trio.MemoryReceiveChannel[Piece],
) -> AsyncGenerator[Piece | Result | Exception, None]:
    """Each piece received as the job sends it, then what `result()` returned, or the
    exception it raised (the job's failure, which the stream tells its client). The
    job's end closes `send`, which ends the pieces; cancelled, the wait for the result
    is cancelled with it."""
    outcome: list[Result | Exception] = []

    async def wait_for_job() -> None:
        with send:
            try:
                outcome.append(await result())
            except Exception as exc:  # noqa: BLE001 (the job's failure, told to the client in the stream)
                outcome.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_for_job)
        async with receive:
            async for piece in receive:
                yield piece
    yield outcome[0]
