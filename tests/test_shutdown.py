"""Graceful shutdown on SIGTERM: readiness turns 503 at once, new requests are refused with a 503 that says why,
the requests in flight (SSE, unary, WebSocket) run to their end within the drain timeout
or are cut with an error event after it, and the process exits 0 with one log line per
phase.

Two servers, one per outcome of the drain: every request finishes, or none can. Each
test takes its server out of the pool, since stopping it is the point. The same under
the hypercorn command: test_launcher_parity.py.
Requests are kept running by asking for many tokens with ignore_eos; nothing here
depends on what the model writes.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import trio
from trio_websocket import ConnectionClosed, open_websocket_url

from conftest import RunningServer, sample_value
from helpers import assert_error, chat_body, completion_body
from openai_schema import validate
from server_pool import server_fixture
from sse import MODEL, parse_sse

# Tokens a request asks for when it should finish within the default drain (30 s) but
# still be running when the signal comes; and one that cannot finish in a short drain.
FINISHES = 96
NEVER_FINISHES = 3000
SHUTTING_DOWN = "server_shutting_down"
# Only keeps a broken server from hanging the test; nothing is timed against it.
HANG_GUARD = 90

draining_server = server_fixture("draining_server")
short_drain_server = server_fixture("short_drain_server", "--drain-timeout", "1")

# What the drain's first log line names as its cause, by command: Hypercorn's worker is
# not told which signal its main process received.
CAUSES = {"serve": "SIGTERM", "hypercorn": "hypercorn shutdown"}


def ws_url(server: RunningServer) -> str:
    return server.base_url.replace("http://", "ws://") + "/v1/responses"


def response_create(max_output_tokens: int, model: str = MODEL, **fields: Any) -> str:
    return json.dumps(
        {
            "type": "response.create",
            "model": model,
            "input": "Write a long story.",
            "max_output_tokens": max_output_tokens,
            "ignore_eos": True,
            **fields,
        }
    )


def named_events(raw: str) -> list[dict[str, Any]]:
    """The events of a Responses SSE body; asserts the framing and the final [DONE]."""
    blocks = raw.rstrip("\n").split("\n\n")
    assert blocks[-1] == "data: [DONE]", blocks[-1][:120]
    events = []
    for block in blocks[:-1]:
        name, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}", block[:120]
        events.append(event)
    return events


class Traffic:
    """Requests sent to one server before it is told to stop, each read to its end (the
    requests of `model`)."""

    def __init__(
        self, server: RunningServer, http: httpx.AsyncClient, nursery: trio.Nursery, model: str = MODEL
    ) -> None:
        self.server = server
        self.http = http
        self.nursery = nursery
        self.model = model
        self.results: dict[str, Any] = {}
        self.sent = 0

    def stream(self, name: str, path: str, body: dict[str, Any]) -> None:
        async def run() -> None:
            async with self.http.stream("POST", path, json=body) as response:
                assert response.status_code == 200, await response.aread()
                self.results[name] = (await response.aread()).decode()

        self._start(run)

    def unary(self, name: str, path: str, body: dict[str, Any]) -> None:
        async def run() -> None:
            self.results[name] = await self.http.post(path, json=body)

        self._start(run)

    def socket(self, name: str, max_output_tokens: int) -> Callable[[str], Awaitable[None]]:
        """A WebSocket with one response running; reads every event until the server
        closes it (its close code goes last). Returns a sender of further frames."""
        opened = trio.Event()
        box: dict[str, Any] = {}

        async def run() -> None:
            events: list[Any] = []
            self.results[name] = events
            async with open_websocket_url(ws_url(self.server)) as ws:
                box["ws"] = ws
                await ws.send_message(response_create(max_output_tokens, self.model))
                opened.set()
                try:
                    while True:
                        events.append(json.loads(await ws.get_message()))
                except ConnectionClosed as closed:
                    events.append(closed.reason.code)

        async def send(frame: str) -> None:
            await opened.wait()
            await box["ws"].send_message(frame)

        self._start(run)
        return send

    def _start(self, run: Callable[[], Awaitable[None]]) -> None:
        self.sent += 1
        self.nursery.start_soon(run)

    async def all_running(self) -> None:
        """Wait until the scheduler serves every request sent (so none is refused)."""
        while True:
            text = (await self.http.get("/metrics")).text
            if sample_value(text, "ovtrio_requests_running", model_name=self.model) >= self.sent:
                return
            await trio.sleep(0.05)


async def exit_code(process: subprocess.Popen) -> int:
    return await trio.to_thread.run_sync(lambda: process.wait(timeout=HANG_GUARD))


def log_lines(server: RunningServer) -> list[str]:
    return server.log_path.read_text().splitlines()


def assert_phases(server: RunningServer, command: str, draining: int, outcome: str, since: int = 0) -> None:
    """One line per phase, in order: draining, drained or cut, engine released, exit
    (Hypercorn's worker cannot say with which code its process will exit); in the log's
    lines from the line `since` on (a server that unloaded models before logged
    "engine released" then too)."""
    lines = log_lines(server)[since:]
    phases = [
        f"{CAUSES[command]}: shutting down, draining {draining} requests",
        outcome,
        "engine released",
        *(["exiting with code 0"] if command == "serve" else []),
    ]
    found = [next((i for i, line in enumerate(lines) if phase in line), None) for phase in phases]
    assert None not in found and found == sorted(found), "\n".join(lines)


async def assert_new_requests_refused(http: httpx.AsyncClient, model: str) -> None:
    """During the drain a new completion, chat stream and response for `model` are each a
    503 shutting_down with Retry-After."""
    for path, body in (
        ("/v1/completions", completion_body(model=model, max_tokens=2)),
        ("/v1/chat/completions", chat_body(model=model, max_tokens=2, stream=True)),
        ("/v1/responses", {"model": model, "input": "Hi", "max_output_tokens": 2}),
    ):
        refused = await http.post(path, json=body)
        assert_error(refused, 503, param=None, code=SHUTTING_DOWN, type="server_error")
        assert int(refused.headers["Retry-After"]) >= 0


def assert_stream_and_unary_finished(traffic: Traffic) -> None:
    """The drained chat stream and unary completion ended normally, with every token."""
    chunks = parse_sse(traffic.results["chat"])
    assert all("error" not in chunk for chunk in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    unary = traffic.results["unary"]
    assert unary.status_code == 200 and unary.json()["usage"]["completion_tokens"] == FINISHES


async def test_sigterm_lets_requests_in_flight_finish_and_refuses_new_ones(server_pool):
    server = server_pool.take("draining_server")
    try:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=HANG_GUARD) as http:
            with trio.fail_after(HANG_GUARD):
                async with trio.open_nursery() as nursery:
                    traffic = Traffic(server, http, nursery)
                    traffic.stream(
                        "chat", "/v1/chat/completions", chat_body(max_tokens=FINISHES, ignore_eos=True, stream=True)
                    )
                    traffic.unary("unary", "/v1/completions", completion_body(max_tokens=FINISHES, ignore_eos=True))
                    send_frame = traffic.socket("socket", FINISHES)
                    await traffic.all_running()
                    server.process.send_signal(signal.SIGTERM)

                    # As soon as the signal is handled: not ready, still alive, new work
                    # refused with a reason.
                    ready = await http.get("/health/ready")
                    while ready.status_code == 200:  # the signal is on its way
                        await trio.sleep(0.01)
                        ready = await http.get("/health/ready")
                    assert ready.status_code == 503 and ready.json()["status"] == "draining"
                    assert ready.json()["models"] == [{"id": MODEL, "status": "draining"}]
                    await send_frame(response_create(2, stream_id="late"))
                    live = await http.get("/health")
                    assert live.status_code == 200
                    await assert_new_requests_refused(http, MODEL)
            assert await exit_code(server.process) == 0
    finally:
        if server.process.poll() is None:
            server.process.kill()

    # The requests in flight ended normally, every token they asked for written.
    assert_stream_and_unary_finished(traffic)

    # The socket: its response ran to its end, a late one was refused, and once the
    # drain was over the server said why it closed the socket, then closed it.
    events = traffic.results["socket"]
    assert events[-1] == 1001  # going away
    *response_events, closing = events[:-1]
    assert closing["type"] == "error" and closing["code"] == SHUTTING_DOWN and "stream_id" not in closing
    refusals = [e for e in response_events if e.get("stream_id") == "late"]
    assert [(e["type"], e["code"]) for e in refusals] == [("error", SHUTTING_DOWN)]
    finals = [e for e in response_events if e["type"].startswith("response.") and "response" in e]
    assert finals[-1]["type"] == "response.incomplete"
    assert finals[-1]["response"]["usage"]["output_tokens"] == FINISHES

    assert_phases(server, "serve", 3, "drained in")


async def test_requests_still_running_at_the_drain_timeout_end_with_an_error(server_pool):
    server = server_pool.take("short_drain_server")
    try:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=HANG_GUARD) as http:
            with trio.fail_after(HANG_GUARD):
                async with trio.open_nursery() as nursery:
                    traffic = Traffic(server, http, nursery)
                    traffic.stream(
                        "chat",
                        "/v1/chat/completions",
                        chat_body(max_tokens=NEVER_FINISHES, ignore_eos=True, stream=True),
                    )
                    traffic.stream(
                        "responses",
                        "/v1/responses",
                        {
                            "model": MODEL,
                            "input": "Write a long story.",
                            "max_output_tokens": NEVER_FINISHES,
                            "ignore_eos": True,
                            "stream": True,
                        },
                    )
                    traffic.unary(
                        "unary", "/v1/chat/completions", chat_body(max_tokens=NEVER_FINISHES, ignore_eos=True)
                    )
                    traffic.socket("socket", NEVER_FINISHES)
                    await traffic.all_running()
                    server.process.send_signal(signal.SIGTERM)
            assert await exit_code(server.process) == 0
    finally:
        if server.process.poll() is None:
            server.process.kill()

    # Chat: an error chunk, then [DONE] (parse_sse checks the [DONE]).
    chunks = parse_sse(traffic.results["chat"])
    assert chunks[-1]["error"]["code"] == SHUTTING_DOWN
    assert all("error" not in chunk for chunk in chunks[:-1])

    # Responses over SSE: response.failed ends the stream, then [DONE].
    events = named_events(traffic.results["responses"])
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["status"] == "failed" and events[-1]["response"]["error"]["message"]

    # Unary: an error body in OpenAI's shape, retryable.
    unary = traffic.results["unary"]
    assert_error(unary, 503, param=None, code=SHUTTING_DOWN, type="server_error")
    assert "Retry-After" in unary.headers

    # WebSocket: the response fails, then the socket's error event, then the close.
    socket_events = traffic.results["socket"]
    assert socket_events[-1] == 1001
    assert socket_events[-3]["type"] == "response.failed"
    assert socket_events[-2]["type"] == "error" and socket_events[-2]["code"] == SHUTTING_DOWN
    for event in (events[-1], *socket_events[-3:-1]):
        validate(event, "ResponseStreamEvent")

    assert_phases(server, "serve", 4, "drain timed out after")
    assert any("cut 4 requests" in line for line in log_lines(server))


def test_the_drain_patch_leaves_other_hypercorn_code_alone(monkeypatch):
    """A Hypercorn whose worker or trigger differs (fixed, or reworked) keeps its own
    trigger, and the log says that a shutdown will not drain."""
    import hypercorn.trio.run as trio_run

    from ovtrio.server.hypercorn_patches import drain as hypercorn_drain

    said: list[str] = []
    monkeypatch.setattr(hypercorn_drain, "_applied", False)
    monkeypatch.setattr(
        hypercorn_drain,
        "PATCHED_SOURCES",
        {**hypercorn_drain.PATCHED_SOURCES, "hypercorn.trio.run.trio_worker": "0" * 64},
    )
    monkeypatch.setattr(hypercorn_drain.log, "warning", lambda message, *args: said.append(message % args))
    before = trio_run.check_multiprocess_shutdown_event

    async def drain(cause: str) -> None:
        raise AssertionError("never called")

    assert hypercorn_drain.apply(drain) is False
    assert trio_run.check_multiprocess_shutdown_event is before
    assert len(said) == 1 and "trio_worker" in said[0] and "will not drain" in said[0]
