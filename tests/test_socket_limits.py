"""The Responses WebSocket's limits: a message over the size limit is answered with an
`error` event and the socket stays usable (also past Hypercorn's own 16 MiB limit,
which used to close it with 1009); a socket idle for the idle timeout is closed with
code 1000, never while a response runs (ovtrio/server/hypercorn_patches/websocket_message_size.py,
ovtrio/api/responses/socket.py). The same under `hypercorn -k trio ovtrio.app:app`:
test_launcher_parity.py."""

from __future__ import annotations

import json
import math

import pytest
import trio
from trio_websocket import ConnectionClosed, open_websocket_url

from conftest import MODEL
from guarded_servers import SOCKET_IDLE_SECONDS, SOCKET_MAX_MESSAGE_BYTES, origin_server  # noqa: F401 (fixture)
from ovtrio.api.responses.oversized_message import OversizedMessage
from ovtrio.api.responses.socket import IdleClock
from ovtrio.server.hypercorn_patches.websocket_message_size import BoundedMessageBuffer

# Beyond Hypercorn's default websocket_max_message_size (16 MiB).
PAST_HYPERCORN_LIMIT = 17 * 1024 * 1024
GUARD = 120  # seconds; only keeps a broken server from hanging the test


def ws_url(server) -> str:
    return server.base_url.replace("http://", "ws://") + "/v1/responses"


def create(**fields) -> str:
    return json.dumps({"type": "response.create", "model": MODEL, "input": "Hi", "max_output_tokens": 2, **fields})


async def next_event(ws) -> dict:
    with trio.fail_after(GUARD):
        return json.loads(await ws.get_message())


async def runs_a_response(ws) -> None:
    """The socket still serves: a response.create runs to its end."""
    await ws.send_message(create())
    while (event := await next_event(ws))["type"] not in ("response.completed", "response.incomplete"):
        assert event["type"] != "error", event


async def test_message_past_hypercorns_limit_gets_an_error_event(server):
    async with open_websocket_url(ws_url(server), max_message_size=2**26) as ws:
        await ws.send_message("x" * PAST_HYPERCORN_LIMIT)
        error = await next_event(ws)
        assert error["type"] == "error" and error["code"] == "frame_too_large", error
        assert str(PAST_HYPERCORN_LIMIT) in error["message"]
        await runs_a_response(ws)


async def test_message_over_the_setting_gets_an_error_event(origin_server):
    await assert_messages_over_the_setting_get_an_error_event(origin_server)


async def assert_messages_over_the_setting_get_an_error_event(server) -> None:
    """A socket of `server`, whose limit is SOCKET_MAX_MESSAGE_BYTES, reads a message
    just within it and refuses one over it with an event, and serves on."""
    async with open_websocket_url(ws_url(server)) as ws:
        # Just within the limit: read, and refused for what it says.
        padded = json.dumps({"type": "response.create", "model": MODEL, "max_output_tokens": 0, "input": ""})
        within = padded[:-2] + "x" * (SOCKET_MAX_MESSAGE_BYTES - len(padded)) + '"}'
        assert len(within.encode()) == SOCKET_MAX_MESSAGE_BYTES
        await ws.send_message(within)
        assert (await next_event(ws))["param"] == "max_output_tokens"
        # Bytes count, not characters: 2 bytes each in UTF-8.
        await ws.send_message("é" * (SOCKET_MAX_MESSAGE_BYTES // 2 + 1))
        assert (await next_event(ws))["code"] == "frame_too_large"
        await ws.send_message(b"\0" * (SOCKET_MAX_MESSAGE_BYTES + 1))
        assert (await next_event(ws))["code"] == "frame_too_large"
        await runs_a_response(ws)


async def test_idle_socket_is_closed_and_a_busy_one_is_not(origin_server):
    server = origin_server
    async with open_websocket_url(ws_url(server)) as ws:
        # A message a second, for twice the idle timeout: the socket stays open.
        for _ in range(2 * SOCKET_IDLE_SECONDS):
            await ws.send_message("{}")
            assert (await next_event(ws))["type"] == "error"
            await trio.sleep(1)
        await runs_a_response(ws)
        await closed_once_idle(ws)


async def closed_once_idle(ws) -> None:
    """`ws`, left idle from now, is closed by the server after the idle timeout with
    code 1000, saying why."""
    started = trio.current_time()
    with trio.fail_after(GUARD), pytest.raises(ConnectionClosed) as closed:
        await ws.get_message()
    assert trio.current_time() - started >= SOCKET_IDLE_SECONDS - 0.5
    assert closed.value.reason.code == 1000
    assert "idle" in closed.value.reason.reason


# --- the parts on their own ------------------------------------------------------------


async def test_idle_clock_waits_for_running_responses(autojump_clock):
    clock = IdleClock(10)
    never = trio.Event()

    async def receive() -> str:
        await never.wait()
        return ""

    clock.response_started()
    async with trio.open_nursery() as nursery:

        async def end_response_later() -> None:
            await trio.sleep(100)
            clock.response_ended()

        nursery.start_soon(end_response_later)
        assert await clock.receive(receive) is None
    assert clock.expired and math.isclose(trio.current_time(), 110)


def test_bounded_buffer_drops_what_is_over_the_limit(monkeypatch):
    from wsproto.events import BytesMessage, TextMessage

    monkeypatch.setattr("ovtrio.server.hypercorn_patches.websocket_message_size._limit", 8)
    buffer = BoundedMessageBuffer(16 * 1024 * 1024)
    buffer.extend(TextMessage(data="abcd", message_finished=False))
    buffer.extend(TextMessage(data="éé", message_finished=True))
    assert buffer.to_message()["text"] == "abcdéé"
    buffer.clear()
    buffer.extend(TextMessage(data="abcd", message_finished=False))
    buffer.extend(TextMessage(data="ééé", message_finished=False))
    assert buffer.value is None  # nothing kept once over
    buffer.extend(TextMessage(data="x" * 100, message_finished=True))
    oversized = buffer.to_message()["text"]
    assert isinstance(oversized, OversizedMessage) and oversized.length == 110 and oversized == ""
    buffer.clear()
    buffer.extend(BytesMessage(data=b"12345678", message_finished=True))
    assert buffer.to_message()["bytes"] == b"12345678"
