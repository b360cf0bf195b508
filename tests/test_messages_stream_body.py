"""The streamed Messages body on its own, over a small fake scheduler (no engine, no
HTTP): `message_start` goes out at once, `ping` every PING_INTERVAL while the request
waits for the scheduler, an `error` event for a refusal after the stream began, and
closing the body leaves the submission (which is what cancels an engine request)."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.lowlevel

from messages_stream import walk
from ovtrio.api.messages.prepare import PreparedMessage
from ovtrio.api.messages.stream import PING_INTERVAL, message_stream
from ovtrio.api.messages.writer import MessageWriter
from ovtrio.api.sse import EventStream
from ovtrio.output import OutputStage
from ovtrio.scheduler import Completed, Delta, Overloaded


class FakeStream:
    def __init__(self, batches: list[list[Any]]) -> None:
        self._batches = list(batches)

    async def receive_available(self) -> list[Any]:
        await trio.lowlevel.checkpoint()
        return self._batches.pop(0) if self._batches else []


class FakeScheduler:
    """Takes one request: waits until `admit` is set, then raises `refusal` or streams
    `batches`; records whether the submission was left."""

    def __init__(self, batches: list[list[Any]], refusal: Exception | None = None) -> None:
        self.admit = trio.Event()
        self.batches = batches
        self.refusal = refusal
        self.left = False

    @asynccontextmanager
    async def submit(self, request: Any):
        try:
            await self.admit.wait()
            if self.refusal is not None:
                raise self.refusal
            yield FakeStream(self.batches)
        finally:
            self.left = True


REPLY = [[Delta(0, "Hello", [1]), Delta(0, " there", [2])], [Delta(0, "!", [3], "stop"), Completed(5, 3)]]


def stream_of(scheduler: FakeScheduler) -> EventStream:
    ready = PreparedMessage(None, SimpleNamespace(params=SimpleNamespace(constraint=None)), OutputStage(), 5, ())  # type: ignore[arg-type]
    return message_stream(scheduler, ready, MessageWriter("msg_test", "model", 5))  # type: ignore[arg-type]


def events_of(frames: list[bytes]) -> list[dict[str, Any]]:
    text = b"".join(frames).decode()
    return [json.loads(line[len("data: ") :]) for line in text.splitlines() if line.startswith("data: ")]


async def test_a_waiting_request_pings_until_it_runs(autojump_clock):
    scheduler = FakeScheduler(REPLY)
    body = stream_of(scheduler)
    frames = [await body.__anext__()]
    assert events_of(frames)[0]["type"] == "message_start"
    started = trio.current_time()
    frames += [await body.__anext__(), await body.__anext__()]
    assert [e["type"] for e in events_of(frames[1:])] == ["ping", "ping"]
    assert trio.current_time() - started == pytest.approx(2 * PING_INTERVAL)
    scheduler.admit.set()
    frames += [frame async for frame in body]
    await body.aclose()
    message = walk(events_of(frames))
    assert message["content"] == [{"type": "text", "text": "Hello there!"}]
    assert message["stop_reason"] == "end_turn" and message["usage"]["output_tokens"] == 3
    assert scheduler.left


async def test_a_refusal_after_the_stream_began_is_an_error_event(autojump_clock):
    scheduler = FakeScheduler(REPLY, refusal=Overloaded("the server is full", 2))
    scheduler.admit.set()
    body = stream_of(scheduler)
    events = events_of([frame async for frame in body])
    await body.aclose()
    assert [e["type"] for e in events] == ["message_start", "error"]
    assert events[1]["error"]["type"] == "rate_limit_error"


async def test_closing_the_body_leaves_the_submission(autojump_clock):
    scheduler = FakeScheduler(REPLY)
    body = stream_of(scheduler)
    await body.__anext__()
    await body.__anext__()  # a ping: the request still waits
    assert not scheduler.left
    await body.aclose()
    assert scheduler.left
    with pytest.raises(StopAsyncIteration):
        await body.__anext__()
