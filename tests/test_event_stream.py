"""The streaming driver every streamed endpoint answers with (ovtrio/api/sse.py), on its
own over a small submission (no engine, no HTTP): by default it submits before the
handler answers, so a refusal is still an HTTP error; an exception after that ends the
body with it; closing the body leaves the submission (which is what cancels an engine
request). Told to answer at once (the Messages stream, tested with its writer in
test_messages_stream_body.py), a failure after the answer is its last frame, and the
frames are made no faster than the client takes them."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing

from ovtrio.api.sse import AnswerAtOnce, EventStream
from ovtrio.scheduler import Overloaded


class Submission:
    """One request's submission: refused with `refusal`, or a stream of `batches`; says
    whether it was entered and left."""

    def __init__(self, batches: list[str], refusal: Exception | None = None) -> None:
        self.batches = batches
        self.refusal = refusal
        self.entered = self.left = False

    @asynccontextmanager
    async def __call__(self) -> Any:
        try:
            await trio.lowlevel.checkpoint()
            if self.refusal is not None:
                raise self.refusal
            self.entered = True
            yield self
        finally:
            self.left = True

    async def receive_available(self) -> list[str]:
        await trio.lowlevel.checkpoint()
        return [self.batches.pop(0)] if self.batches else []


async def frames(stream: Any) -> AsyncGenerator[bytes, None]:
    while batch := await stream.receive_available():
        if batch == ["fail"]:
            raise RuntimeError("the writer failed")
        yield f"data: {batch[0]}\n\n".encode()
    yield b"data: [DONE]\n\n"


async def test_the_request_is_submitted_before_the_answer():
    submission = Submission(["a", "b"])
    body = EventStream(submission(), frames)
    assert not submission.entered
    await body.open()
    assert submission.entered and not submission.left
    assert [frame async for frame in body] == [b"data: a\n\n", b"data: b\n\n", b"data: [DONE]\n\n"]
    await body.aclose()
    assert submission.left


async def test_a_refusal_is_raised_by_open_before_any_answer():
    submission = Submission([], refusal=Overloaded("the server is full", 2))
    with pytest.raises(Overloaded):
        await EventStream(submission(), frames).open()
    assert submission.left


async def test_a_failure_after_the_answer_ends_the_body_with_it():
    submission = Submission(["a", "fail", "b"])
    body = await EventStream(submission(), frames).open()
    assert await body.__anext__() == b"data: a\n\n"
    with pytest.raises(RuntimeError, match="the writer failed"):
        await body.__anext__()
    await body.aclose()
    assert submission.left


async def test_closing_the_body_early_leaves_the_submission():
    submission = Submission(["a", "b"])
    body = await EventStream(submission(), frames).open()
    await body.__anext__()
    await body.aclose()
    assert submission.left
    with pytest.raises(StopAsyncIteration):
        await body.__anext__()


# ---- answering at once (the Messages stream) ----------------------------------------------

AT_ONCE = AnswerAtOnce(b"opening\n\n", b"ping\n\n", 5.0, lambda error: f"failed: {error}\n\n".encode())


async def test_at_once_a_failure_mid_stream_is_the_last_frame_and_the_submission_is_left():
    submission = Submission(["a", "fail", "b"])
    body = EventStream(submission(), frames, AT_ONCE)
    assert [frame async for frame in body] == [b"opening\n\n", b"data: a\n\n", b"failed: the writer failed\n\n"]
    assert submission.left
    await body.aclose()


async def test_at_once_the_frames_are_made_no_faster_than_the_client_takes_them():
    """A client that stops reading holds its request back: the task making the frames
    waits for each to be taken, so it neither reads the request's outputs ahead nor
    buffers frames."""
    submission = Submission([str(i) for i in range(100)])
    body = EventStream(submission(), frames, AT_ONCE)
    assert await body.__anext__() == b"opening\n\n"
    assert await body.__anext__() == b"data: 0\n\n"
    await trio.testing.wait_all_tasks_blocked()
    assert len(submission.batches) >= 97
    await body.aclose()
    assert submission.left
