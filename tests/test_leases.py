"""A request's leases on its models (ovtrio/api/leases.py) last until its response has
ended: through a streamed body written after the handler returned, and until a client
that leaves is gone; a WebSocket's responses each hold their own. Pure logic, over a
small Quart-Trio app served by its test client (the ASGI call as Hypercorn makes it)."""

from __future__ import annotations

import pytest
import trio
import trio.lowlevel
from quart import Response, websocket
from quart_trio import QuartTrio

from ovtrio.api import leases
from ovtrio.lifecycle.lease import LeaseCount


def leasing_app(count: LeaseCount, seen: list[int]) -> QuartTrio:
    app = QuartTrio("leases")

    @app.get("/stream")
    async def stream() -> Response:
        leases.hold(count.take())

        async def body():
            for _ in range(3):
                await trio.lowlevel.checkpoint()
                seen.append(count.held)  # written after the handler returned
                yield b"part\n"

        return Response(body(), mimetype="text/plain")

    @app.get("/fails")
    async def fails() -> Response:
        leases.hold(count.take())
        raise RuntimeError("the handler fails after taking its lease")

    @app.websocket("/socket")
    async def socket() -> None:
        await websocket.accept()
        with leases.separate() as held:
            leases.hold(count.take())
        seen.append(count.held)
        held.release()  # the response is over: its lease goes, the socket stays
        seen.append(count.held)
        await websocket.send("done")
        await websocket.receive()

    leases.install(app)
    return app


async def test_a_streamed_response_holds_its_lease_until_its_last_byte():
    count, seen = LeaseCount(), []
    client = leasing_app(count, seen).test_client()
    reply = await client.get("/stream")
    assert await reply.get_data() == b"part\n" * 3
    assert seen == [1, 1, 1]
    assert count.held == 0


async def test_a_handler_that_fails_gives_its_lease_back():
    count, seen = LeaseCount(), []
    app = leasing_app(count, seen)
    reply = await app.test_client().get("/fails")
    assert reply.status_code == 500
    assert count.held == 0


async def test_a_websocket_response_gives_its_lease_back_when_it_ends_not_when_the_socket_closes():
    count, seen = LeaseCount(), []
    client = leasing_app(count, seen).test_client()
    async with client.websocket("/socket") as socket:
        assert await socket.receive() == "done"
        assert seen == [1, 0] and count.held == 0  # the socket is still open
        await socket.send("bye")


def test_a_lease_taken_outside_a_request_is_an_error_and_is_not_kept():
    async def main() -> None:
        count = LeaseCount()
        with pytest.raises(RuntimeError, match="outside a request"):
            leases.hold(count.take())
        assert count.held == 0

    trio.run(main)
