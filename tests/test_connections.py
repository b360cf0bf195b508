"""Connections that should close do close: after a response to `Connection: close` or
to an HTTP/1.0 request, the client reads EOF and the server keeps no socket open, under
`ovtrio serve` and under `hypercorn -k trio ovtrio.app:app`; an idle keep-alive
connection is closed at the keep-alive timeout (see ovtrio/closing.py)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path


import loopback
from conftest import HYPERCORN_KEEP_ALIVE, HYPERCORN_MODEL, MODEL

# Bounds that only keep a broken server from hanging the test; nothing is timed.
HANG_GUARD = 60

REQUESTS = {
    "close": b"GET /health HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n",
    "http/1.0": b"GET /health HTTP/1.0\r\nHost: test\r\n\r\n",
}


def completion_request(version: str, model: str) -> bytes:
    body = json.dumps({"model": model, "prompt": "Hi", "max_tokens": 2}).encode()
    close = b"Connection: close\r\n" if version == "HTTP/1.1" else b""
    return (
        f"POST /v1/completions {version}\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n".encode()
        + close
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


def exchange(port: int, request: bytes) -> bytes:
    """Send one request and read until the server closes; the whole reply."""
    with socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD) as sock:
        sock.sendall(request)
        reply = b""
        while chunk := sock.recv(65536):  # a socket timeout here means no EOF came
            reply += chunk
    return reply


def status(reply: bytes) -> bytes:
    return reply.split(b"\r\n", 1)[0].split()[1]


def complete(reply: bytes) -> bool:
    """Whether `reply` holds a whole response with a Content-Length body."""
    head, separator, body = reply.partition(b"\r\n\r\n")
    if not separator:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    raise AssertionError(f"no Content-Length in {head!r}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def settled_fds(pid: int, baseline: int) -> int:
    """The process's open descriptors once they are back to `baseline` (or the guard ends)."""
    deadline = time.monotonic() + HANG_GUARD
    count = open_fds(pid)
    while count > baseline and time.monotonic() < deadline:
        time.sleep(0.1)
        count = open_fds(pid)
    return count


def check_closing(port: int, pid: int, rounds: int, model: str = MODEL) -> None:
    loopback.get(f"http://127.0.0.1:{port}/health", timeout=HANG_GUARD)  # any lazy setup done
    baseline = open_fds(pid)
    for _ in range(rounds):
        for request in REQUESTS.values():
            reply = exchange(port, request)
            assert status(reply) == b"200", reply[:100]
    for version in ("HTTP/1.1", "HTTP/1.0"):
        reply = exchange(port, completion_request(version, model))
        assert status(reply) == b"200", reply[:300]
        assert b'"text_completion"' in reply
    assert settled_fds(pid, baseline) <= baseline


def test_closing_requests_get_eof_and_leave_no_descriptor(server):
    port = int(server.base_url.rsplit(":", 1)[1])
    check_closing(port, server.process.pid, rounds=100)  # 200 requests, half of them HTTP/1.0


def test_keep_alive_connections_stay_open(server):
    port = int(server.base_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD) as sock:
        for _ in range(3):
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n")
            reply = b""
            while not complete(reply):
                chunk = sock.recv(65536)
                assert chunk, f"the server closed a keep-alive connection after {reply!r}"
                reply += chunk
            assert status(reply) == b"200", reply


def worker_pid(pid: int) -> int:
    """Hypercorn's CLI serves from one spawned worker process: its pid."""
    deadline = time.monotonic() + HANG_GUARD
    while time.monotonic() < deadline:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.1)
    raise AssertionError("hypercorn started no worker")


def test_closing_requests_get_eof_under_the_hypercorn_command(hypercorn_server):
    port = int(hypercorn_server.base_url.rsplit(":", 1)[1])
    check_closing(port, worker_pid(hypercorn_server.process.pid), rounds=20, model=HYPERCORN_MODEL)


def test_idle_keep_alive_connections_close_at_the_keep_alive_timeout(hypercorn_server):
    """The idle timer starts after each response (the same fix): an idle keep-alive
    connection is closed by the server, here after the keep-alive timeout this server
    was started with (and at once on shutdown, which the same timer waits for)."""
    port = int(hypercorn_server.base_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n")
        reply = b""
        while not complete(reply):
            reply += sock.recv(65536)
        assert status(reply) == b"200", reply
        answered = time.monotonic()
        assert sock.recv(65536) == b""  # a socket timeout here means the server kept it open
        # Closed by the idle timer, not by anything sooner.
        assert time.monotonic() - answered >= HYPERCORN_KEEP_ALIVE * 0.9


def test_the_fix_leaves_other_hypercorn_code_alone(monkeypatch):
    """A Hypercorn whose method differs (fixed, or reworked) is not patched, and says so."""
    from hypercorn.trio.tcp_server import TCPServer

    from ovtrio import closing

    said: list[str] = []
    monkeypatch.setattr(closing, "_applied", False)
    monkeypatch.setattr(closing, "PATCHED_SOURCE_SHA256", "0" * 64)
    monkeypatch.setattr(closing.log, "info", lambda message, *args: said.append(message % args))
    before = TCPServer.protocol_send
    assert closing.apply() is False
    assert TCPServer.protocol_send is before
    assert len(said) == 1 and "leaving it unpatched" in said[0]
