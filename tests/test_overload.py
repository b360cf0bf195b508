"""Overload, against one real server started with small limits: a full server refuses
with 429s (HTTP) and error events (WebSocket) before any work is done, and a client
that stops reading has its request paused, then cancelled, or resumed with nothing lost
if it reads again in time. With the same limits in process (tests/in_process.py), over
a fake engine held mid-generation: a burst beyond the queue is split exactly into those
that run, those that wait and 429s, and oversized requests get 400s naming the
parameter.

Nothing here depends on how fast the machine is: waits poll the server's gauges with
generous limits, and outputs are forced with max_tokens and ignore_eos.
"""

from __future__ import annotations

import json
import socket
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import h11
import httpx
import pytest
import trio
from trio_websocket import open_websocket_url

from conftest import MODEL, RunningServer
from held_steps import held_steps
from helpers import assert_error, chat_body, complete, completion_body, post
from in_process import InProcessServer, in_process_server
from openai_schema import validate, validate_completion_chunk
from server_pool import server_fixture

RUNNING, QUEUED = 2, 2
SLOW_READER_BUFFER, SLOW_READER_TIMEOUT = 8, 2
MAX_PROMPTS, MAX_PROMPT_TOKENS = 4, 64


SMALL_LIMITS = (
    "--max-running-sequences",
    str(RUNNING),
    "--max-queued-requests",
    str(QUEUED),
    "--max-prompts-per-request",
    str(MAX_PROMPTS),
    "--max-prompt-tokens-per-request",
    str(MAX_PROMPT_TOKENS),
    "--slow-reader-buffer",
    str(SLOW_READER_BUFFER),
    "--slow-reader-timeout",
    str(SLOW_READER_TIMEOUT),
)
overload_server = server_fixture("overload_server", *SMALL_LIMITS)
# The same limits in process, over a fake engine that can be held mid-generation: for
# what the HTTP layer decides alone (a burst's split, the request caps).
limits_in_process = in_process_server("limits_in_process", *SMALL_LIMITS)


@pytest.fixture
def server(overload_server: RunningServer) -> RunningServer:
    """Here every test runs on the server with small limits."""
    return overload_server


def wait_for(
    server: RunningServer | InProcessServer, condition: Callable[[], bool], what: str, within: float = 120
) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {within} s"
        time.sleep(0.05)


def wait_idle(server: RunningServer | InProcessServer) -> None:
    wait_for(
        server,
        lambda: all(
            server.metric(name) == 0
            for name in ("ovtrio_requests_running", "ovtrio_requests_waiting", "ovtrio_engine_requests")
        ),
        "the server holds no request",
    )


def assert_overloaded(response: httpx.Response) -> None:
    assert_error(response, 429, param=None, code="rate_limit_exceeded", type="requests")
    assert int(response.headers["retry-after"]) >= 1


async def test_a_burst_beyond_the_queue_gets_429s_and_the_rest_succeed(limits_in_process):
    """With the engine held, the burst's first RUNNING requests run, QUEUED wait, and every
    other is refused with a 429 at once; then the engine goes on and the 200s end whole."""
    server = limits_in_process
    requests = 16
    statuses: Counter[int] = Counter()

    async def one(http: httpx.AsyncClient, i: int) -> None:
        body = completion_body("Hello", max_tokens=48, ignore_eos=True, temperature=0, stream=i % 2 == 1)
        async with http.stream("POST", "/v3/completions", json=body) as response:
            raw = await response.aread()
        statuses[response.status_code] += 1
        if response.status_code == 429:
            assert_overloaded(httpx.Response(429, headers=response.headers, content=raw))
        else:
            assert response.status_code == 200, raw
            if body["stream"]:
                assert raw.endswith(b"data: [DONE]\n\n")
            else:
                assert json.loads(raw)["usage"]["completion_tokens"] == 48

    refused_before = server.metric("ovtrio_requests_rejected_total")
    overflow = requests - RUNNING - QUEUED
    with held_steps(server, MODEL) as steps:
        with trio.fail_after(180):
            async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
                async with trio.open_nursery() as nursery:
                    for i in range(requests):
                        nursery.start_soon(one, http, i)
                    # Every request of the burst is running, waiting or refused.
                    while (
                        server.metric("ovtrio_requests_rejected_total")
                        - refused_before
                        + server.metric("ovtrio_requests_running")
                        + server.metric("ovtrio_requests_waiting")
                    ) < requests:
                        await trio.sleep(0.02)
                    assert server.metric("ovtrio_requests_running") == RUNNING
                    assert server.metric("ovtrio_requests_waiting") == QUEUED
                    assert server.metric("ovtrio_engine_requests") == RUNNING
                    steps.release()
    assert statuses == {200: RUNNING + QUEUED, 429: overflow}, statuses
    assert server.metric("ovtrio_requests_rejected_total") - refused_before == overflow
    wait_idle(server)


async def test_a_full_server_refuses_http_and_websocket_before_any_work(server):
    """With RUNNING long streams running and QUEUED requests waiting, the server is full:
    new requests are refused before the engine sees them, over HTTP (streamed or not)
    and over the Responses WebSocket, which stays usable and serves once there is room."""

    async def hold(http: httpx.AsyncClient, body: dict[str, Any]) -> None:
        async with http.stream("POST", "/v3/completions", json=body) as response:
            async for _ in response.aiter_bytes():
                pass

    long_stream = completion_body("Once", max_tokens=4000, ignore_eos=True, stream=True)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
        async with trio.open_nursery() as holders:
            for _ in range(RUNNING):
                holders.start_soon(hold, http, long_stream)
            with trio.fail_after(120):
                while server.metric("ovtrio_requests_running") < RUNNING:
                    await trio.sleep(0.05)
            for _ in range(QUEUED):
                holders.start_soon(hold, http, completion_body("Hi", max_tokens=1))
            with trio.fail_after(120):
                while server.metric("ovtrio_requests_waiting") < QUEUED:
                    await trio.sleep(0.05)

            unary = await http.post("/v1/completions", json=completion_body("Hi", max_tokens=4))
            assert_overloaded(unary)
            streamed = await http.post("/v1/chat/completions", json=chat_body("Hi", max_tokens=4, stream=True))
            assert_overloaded(streamed)
            validate(streamed.json(), "ErrorResponse")
            # Refused before the engine got them: it holds only the running streams.
            assert server.metric("ovtrio_engine_requests") == RUNNING
            # What the endpoint picker reads: the queued requests wait, the streams run.
            assert server.metric("vllm:num_requests_waiting", model_name=MODEL, engine="0") == QUEUED
            assert server.metric("vllm:num_requests_running", model_name=MODEL, engine="0") == RUNNING

            url = server.base_url.replace("http://", "ws://") + "/v1/responses"
            create = {
                "type": "response.create",
                "model": MODEL,
                "input": "Hi",
                "max_output_tokens": 4,
                "ignore_eos": True,
                "stream_id": "a",
            }
            async with open_websocket_url(url) as ws:
                await ws.send_message(json.dumps(create))
                with trio.fail_after(60):
                    event = json.loads(await ws.get_message())
                validate(event, "ResponseErrorEvent")
                assert event["type"] == "error" and event["code"] == "rate_limit_exceeded", event
                assert event["stream_id"] == "a"

                holders.cancel_scope.cancel()  # the holders leave: the server has room again
                with trio.fail_after(60):
                    while server.metric("ovtrio_requests_running") or server.metric("ovtrio_requests_waiting"):
                        await trio.sleep(0.05)
                await ws.send_message(json.dumps(create))
                with trio.fail_after(60):
                    while (event := json.loads(await ws.get_message()))["type"] not in ("response.incomplete", "error"):
                        pass
                assert event["type"] == "response.incomplete", event
                assert event["response"]["usage"]["output_tokens"] == 4
    wait_idle(server)


def test_request_caps_are_400s_naming_the_parameter(limits_in_process):
    server = limits_in_process
    base = server.base_url
    too_many = assert_error(
        post(base, "/v3/completions", completion_body(["Hi"] * 1000, max_tokens=1)),
        400,
        param="prompt",
        code="too_many_prompts",
    )
    assert str(MAX_PROMPTS) in too_many["message"] and "1000" in too_many["message"]
    assert_error(
        post(base, "/v3/completions", completion_body([[1, 2]] * (MAX_PROMPTS + 1), max_tokens=1)),
        400,
        param="prompt",
        code="too_many_prompts",
    )
    # n x prompts beyond the choices one request may have (RUNNING by default here).
    assert_error(
        post(base, "/v3/completions", completion_body("Hi", n=RUNNING + 1, temperature=1, max_tokens=1)),
        400,
        param="n",
        code="too_many_choices",
    )
    assert_error(
        post(base, "/v3/completions", completion_body(["Hi", "Ho"], n=2, temperature=1, max_tokens=1)),
        400,
        param="n",
        code="too_many_choices",
    )
    assert_error(
        post(base, "/v3/chat/completions", chat_body("Hi", n=RUNNING + 1, temperature=1, max_tokens=1)),
        400,
        param="n",
        code="too_many_choices",
    )
    # Prompt tokens, all prompts together.
    half = " ".join(["word"] * (MAX_PROMPT_TOKENS // 2 + 4))
    assert_error(
        post(base, "/v3/completions", completion_body([half, half], max_tokens=1)),
        400,
        param="prompt",
        code="too_many_prompt_tokens",
    )
    assert_error(
        post(base, "/v3/chat/completions", chat_body(half + " " + half, max_tokens=1)),
        400,
        param="messages",
        code="too_many_prompt_tokens",
    )
    # Within the caps, the same shapes are served.
    result = complete(base, prompt=["Hi", "Ho"], max_tokens=2, ignore_eos=True, temperature=0)
    assert len(result.texts) == 2 and result.usage["completion_tokens"] == 4
    wait_idle(server)


def test_the_caps_hold_on_the_real_server(server):
    """The caps above, as a real server started with them applies them."""
    half = " ".join(["word"] * (MAX_PROMPT_TOKENS // 2 + 4))
    assert_error(
        post(server.base_url, "/v3/chat/completions", chat_body(half + " " + half, max_tokens=1)),
        400,
        param="messages",
        code="too_many_prompt_tokens",
    )
    assert_error(
        post(server.base_url, "/v3/completions", completion_body(["Hi"] * (MAX_PROMPTS + 1), max_tokens=1)),
        400,
        param="prompt",
        code="too_many_prompts",
    )


class RawStream:
    """A streaming request on a raw socket with a small receive buffer, so that not
    reading soon fills the server's send path; read later through h11."""

    def __init__(self, server: RunningServer, body: dict[str, Any]) -> None:
        host, port = server.base_url.removeprefix("http://").split(":")
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect((host, int(port)))
        self.http = h11.Connection(h11.CLIENT)
        content = json.dumps(body).encode()
        headers = [("host", host), ("content-type", "application/json"), ("content-length", str(len(content)))]
        self.sock.sendall(self.http.send(h11.Request(method="POST", target="/v3/completions", headers=headers)))
        self.sock.sendall(self.http.send(h11.Data(data=content)) + self.http.send(h11.EndOfMessage()))

    def read_to_end(self, timeout: float = 120) -> tuple[int, bytes]:
        self.sock.settimeout(timeout)
        status, body = 0, b""
        while True:
            event = self.http.next_event()
            if event is h11.NEED_DATA:
                self.http.receive_data(self.sock.recv(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                return status, body

    def close(self) -> None:
        self.sock.close()


def sse_events(raw: bytes) -> list[str]:
    return [line[len("data: ") :] for line in raw.decode().split("\n") if line.startswith("data: ")]


def test_a_client_that_stops_reading_is_paused_then_cancelled(server):
    cancelled_before = server.metric("ovtrio_slow_readers_cancelled_total")
    reader = RawStream(server, completion_body("Once upon a time", max_tokens=8000, ignore_eos=True, stream=True))
    try:
        wait_for(server, lambda: server.metric("ovtrio_requests_paused") == 1, "the request is paused")
        # Paused, it stays in the engine, and the server serves others meanwhile.
        assert server.metric("ovtrio_engine_requests") >= 1
        result = complete(server.base_url, max_tokens=8, ignore_eos=True, temperature=0)
        assert result.usage["completion_tokens"] == 8
        # Past the timeout it is cancelled: out of the engine, its KV cache freed.
        wait_for(
            server,
            lambda: server.metric("ovtrio_slow_readers_cancelled_total") == cancelled_before + 1,
            "the paused request is cancelled",
        )
        wait_idle(server)
        wait_for(server, lambda: server.metric("ovtrio_kv_cache_usage_percent") == 0, "the KV cache is freed")
        assert server.metric("ovtrio_requests_paused") == 0
        assert "cancelled: its client read nothing" in server.log_path.read_text()
        tokens = server.metric("ovtrio_generated_tokens_total")
        time.sleep(0.5)
        assert server.metric("ovtrio_generated_tokens_total") == tokens, "tokens are still being generated"
    finally:
        reader.close()


def test_a_paused_client_that_reads_again_gets_the_whole_stream(server):
    cancelled_before = server.metric("ovtrio_slow_readers_cancelled_total")
    tokens = 300
    body = completion_body(
        "Once upon a time",
        max_tokens=tokens,
        ignore_eos=True,
        temperature=0,
        stream=True,
        logprobs=0,
        stream_options={"include_usage": True},
    )
    reader = RawStream(server, body)
    try:
        wait_for(server, lambda: server.metric("ovtrio_requests_paused") == 1, "the request is paused")
        status, raw = reader.read_to_end()
    finally:
        reader.close()
    assert status == 200
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    for chunk in chunks:
        validate_completion_chunk(chunk)
    choices = [choice for chunk in chunks for choice in chunk["choices"]]
    # One log-probability entry per generated token: none was lost while paused.
    assert sum(len(choice["logprobs"]["tokens"]) for choice in choices if choice["logprobs"]) == tokens
    assert [choice["finish_reason"] for choice in choices if choice["finish_reason"]] == ["length"]
    assert chunks[-1]["usage"]["completion_tokens"] == tokens
    assert server.metric("ovtrio_slow_readers_cancelled_total") == cancelled_before
    wait_idle(server)
