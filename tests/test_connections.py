"""Connections that should close do close: after a response to `Connection: close` or
to an HTTP/1.0 request, the client reads EOF and the server keeps no socket open; a
connection the client closes is closed by the server at once, whatever it was doing
(see ovtrio/server/hypercorn_patches/connection_close.py). A spell of accept failures
for lack of descriptors is one log line; a request with an ambiguous length is refused
and its connection closed; a burst of connections is accepted without errors. Under
`ovtrio serve`; the same under the hypercorn command, and its idle keep-alive
connections closed at the keep-alive timeout: test_launcher_parity.py."""

from __future__ import annotations

import json
import os
import resource
import socket
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

import loopback
from conftest import MODEL, RunningServer
from helpers import assert_error

# Bounds that only keep a broken server from hanging the test; nothing is timed.
HANG_GUARD = 60

REQUESTS = {
    "close": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    "http/1.0": b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n",
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
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            reply = b""
            while not complete(reply):
                chunk = sock.recv(65536)
                assert chunk, f"the server closed a keep-alive connection after {reply!r}"
                reply += chunk
            assert status(reply) == b"200", reply


def worker_pid(pid: int) -> int:
    """Hypercorn's CLI serves from one spawned worker process: its pid (multiprocessing's
    resource tracker is a child too)."""
    deadline = time.monotonic() + HANG_GUARD
    while time.monotonic() < deadline:
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                return int(child)
        time.sleep(0.1)
    raise AssertionError("hypercorn started no worker")


def test_the_fix_leaves_other_hypercorn_code_alone(monkeypatch):
    """A Hypercorn whose methods differ (fixed, or reworked) is not patched, and says so."""
    from hypercorn.trio.tcp_server import TCPServer

    from ovtrio.server.hypercorn_patches import connection_close as closing

    said: list[str] = []
    monkeypatch.setattr(closing, "_applied", False)
    monkeypatch.setattr(closing, "PATCHED_SOURCES", {**closing.PATCHED_SOURCES, "_read_data": "0" * 64})
    monkeypatch.setattr(closing.log, "info", lambda message, *args: said.append(message % args))
    before = TCPServer.protocol_send, TCPServer._read_data
    assert closing.apply() is False
    assert (TCPServer.protocol_send, TCPServer._read_data) == before
    assert len(said) == 1 and "TCPServer._read_data" in said[0] and "leaving it unpatched" in said[0]


def port_of(server: RunningServer) -> int:
    return int(server.base_url.rsplit(":", 1)[1])


CLOSE_WAIT = "08"  # the state's number in /proc/net/tcp


def close_wait_sockets(port: int, client_port: int | None = None) -> int:
    """Sockets of the server on `port` (of its connection from `client_port`, if given)
    that the client has closed and the server not yet: TCP's CLOSE-WAIT."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                local, remote, state = fields[1], fields[2], fields[3]
                if (
                    state == CLOSE_WAIT
                    and int(local.rsplit(":", 1)[1], 16) == port
                    and (client_port is None or int(remote.rsplit(":", 1)[1], 16) == client_port)
                ):
                    count += 1
    return count


def settled_close_wait(port: int, client_port: int | None = None, at_most: int = 0) -> int:
    """CLOSE-WAIT sockets (see close_wait_sockets) once they are down to `at_most`, or
    after RELEASED_WITHIN seconds. Under `ovtrio serve` the keep-alive timeout is 75 s:
    a server that waits for it fails; one that closes at once is far within."""
    deadline = time.monotonic() + RELEASED_WITHIN
    count = close_wait_sockets(port, client_port)
    while count > at_most and time.monotonic() < deadline:
        time.sleep(0.1)
        count = close_wait_sockets(port, client_port)
    return count


# Generous for a loaded machine: closing takes milliseconds; the keep-alive timeout under
# `ovtrio serve`, which the server used to wait for, is 75 s.
RELEASED_WITHIN = 40

QUICK_CONNECTIONS = 3000


def test_connections_closed_by_the_client_are_released_at_once(server):
    assert_connections_closed_by_the_client_are_released_at_once(server)


def assert_connections_closed_by_the_client_are_released_at_once(server: RunningServer) -> None:
    """3,000 connections opened and closed at once, as a scan or a flood does, leave no
    socket waiting for the server to close its end (they used to wait for the keep-alive
    timeout, each holding a file descriptor)."""
    port = port_of(server)
    for _ in range(QUICK_CONNECTIONS):
        socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD).close()
    assert settled_close_wait(port, at_most=10) <= 10


def _send_request(sock: socket.socket, method: str, path: str, body: bytes = b"", length: int | None = None) -> None:
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    if method == "POST":
        head += f"Content-Type: application/json\r\nContent-Length: {len(body) if length is None else length}\r\n"
    sock.sendall(head.encode() + b"\r\n" + body)


def _read_until(sock: socket.socket, marker: bytes) -> bytes:
    reply = b""
    while marker not in reply:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection after {reply[-300:]!r}"
        reply += chunk
    return reply


def _stream_body(max_tokens: int) -> bytes:
    return json.dumps(
        {"model": MODEL, "prompt": "Once", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    ).encode()


def _nothing(sock: socket.socket) -> None:
    pass


def _after_a_request(sock: socket.socket) -> None:
    _send_request(sock, "GET", "/health")
    assert complete(_read_until(sock, b"}"))


def _after_a_stream(sock: socket.socket) -> None:
    _send_request(sock, "POST", "/v1/completions", _stream_body(4))
    reply = _read_until(sock, b"data: [DONE]")
    while not reply.endswith(b"\r\n0\r\n\r\n"):  # the chunked body's end: the response is over
        chunk = sock.recv(65536)
        assert chunk, reply
        reply += chunk


def _mid_headers(sock: socket.socket) -> None:
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")


def _mid_body(sock: socket.socket) -> None:
    _send_request(sock, "POST", "/v1/completions", b'{"model": ', length=1000)


def _mid_stream(sock: socket.socket) -> None:
    _send_request(sock, "POST", "/v1/completions", _stream_body(3000))
    reply = b""
    while reply.count(b"data: ") < 2:
        chunk = sock.recv(65536)
        assert chunk, reply
        reply += chunk


def _websocket(sock: socket.socket) -> None:
    sock.sendall(
        b"GET /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    assert _read_until(sock, b"\r\n\r\n").startswith(b"HTTP/1.1 101")


def _text_frame(text: bytes) -> bytes:
    """A client's WebSocket text frame (masked, as clients must send them)."""
    mask = b"\x5a\x17\xc3\x81"
    length = bytes([0x80 | len(text)]) if len(text) < 126 else bytes([0x80 | 126]) + len(text).to_bytes(2, "big")
    return b"\x81" + length + mask + bytes(byte ^ mask[i % 4] for i, byte in enumerate(text))


def _websocket_mid_response(sock: socket.socket) -> None:
    _websocket(sock)
    sock.sendall(
        _text_frame(
            json.dumps(
                {
                    "type": "response.create",
                    "model": MODEL,
                    "input": "Once",
                    "max_output_tokens": 3000,
                    "ignore_eos": True,
                }
            ).encode()
        )
    )
    _read_until(sock, b"response.output_text.delta")


@pytest.mark.parametrize(
    "before_closing",
    [
        _nothing,
        _after_a_request,
        _after_a_stream,
        _mid_headers,
        _mid_body,
        _mid_stream,
        _websocket,
        _websocket_mid_response,
    ],
    ids=[
        "idle",
        "between requests",
        "after a stream",
        "mid-headers",
        "mid-body",
        "mid-stream",
        "websocket",
        "websocket mid-response",
    ],
)
def test_the_server_closes_its_end_as_soon_as_the_client_closes(server, before_closing):
    """Whatever the connection was doing, the server closes its end once it reads the
    client's EOF, and a request in flight is cancelled in the engine as on a disconnect."""
    port = port_of(server)
    engine_requests = server.metric("ovtrio_engine_requests")
    with socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD) as sock:
        client_port = sock.getsockname()[1]
        before_closing(sock)
    assert settled_close_wait(port, client_port) == 0
    deadline = time.monotonic() + HANG_GUARD
    while server.metric("ovtrio_engine_requests") > engine_requests and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.metric("ovtrio_engine_requests") == engine_requests


FINISHED_STREAMS = 10


def test_finished_streams_leave_no_socket_behind(server):
    """Streams read to their end on connections the client then closes (as a client
    that opens a connection per request does): none is left for the keep-alive timeout
    (about half of them used to stay in CLOSE-WAIT)."""
    port = port_of(server)
    client_ports = []
    for _ in range(FINISHED_STREAMS):
        with socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD) as sock:
            client_ports.append(sock.getsockname()[1])
            _after_a_stream(sock)
    assert [settled_close_wait(port, client_port) for client_port in client_ports] == [0] * FINISHED_STREAMS


def _parse_responses(reply: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """The responses in `reply`, each with a Content-Length body: status, headers, body."""
    responses = []
    while reply:
        head, _, rest = reply.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
        length = int(headers["content-length"])
        responses.append((int(status_line.split()[1]), headers, rest[:length]))
        reply = rest[length:]
    return responses


def test_a_request_with_an_ambiguous_length_is_refused_and_its_connection_closed(server):
    assert_a_request_with_an_ambiguous_length_is_refused(server)


def assert_a_request_with_an_ambiguous_length_is_refused(server: RunningServer) -> None:
    """Content-Length and Transfer-Encoding together (request smuggling behind a proxy
    that reads the other one): a 400 in OpenAI's shape, then the connection closes, and
    what came after on it (here a request hidden in the chunked body, as a proxy going by
    Content-Length would pass it on) is never answered."""
    port = port_of(server)
    body = json.dumps({"model": MODEL, "prompt": "Hi", "max_tokens": 1}).encode()
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    hidden = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
            + chunked
            + hidden
        )
        reply = b""
        while chunk := sock.recv(65536):  # a socket timeout here means the server kept it open
            reply += chunk
    [(status, headers, content)] = _parse_responses(reply)
    assert headers.get("connection") == "close"
    error = assert_error(httpx.Response(status, headers=headers, content=content), 400, param=None)
    assert error["code"] == "ambiguous_request_length"


# A WebSocket handshake's end, with a body: given by its Content-Length, or chunked too.
HANDSHAKE_BODIES = {
    "content-length": b"Content-Length: 5\r\n\r\nhello",
    "both": b"Content-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("framing", list(HANDSHAKE_BODIES.values()), ids=list(HANDSHAKE_BODIES))
def test_a_websocket_handshake_with_a_body_is_refused_and_the_server_serves_on(server, framing):
    assert_a_websocket_handshake_with_a_body_is_refused(server, framing)


def assert_a_websocket_handshake_with_a_body_is_refused(server: RunningServer, framing: bytes) -> None:
    """A handshake carrying a body made Hypercorn's protocol raise in the connection's
    reading task, which ended the server's task group: one request took the whole
    server down. Now that connection gets a 400 and is closed, and nothing else is hurt."""
    with socket.create_connection(("127.0.0.1", port_of(server)), timeout=HANG_GUARD) as sock:
        sock.sendall(
            b"GET /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n" + framing
        )
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert status(reply) == b"400", reply
    assert loopback.get(server.base_url + "/health", timeout=HANG_GUARD).status_code == 200


ACCEPT_FAILURE_LINE = "not accepting new connections"


def test_running_out_of_descriptors_is_one_log_line_and_connections_wait(server):
    assert_running_out_of_descriptors_is_one_log_line(server, server.process.pid)


def assert_running_out_of_descriptors_is_one_log_line(server: RunningServer, pid: int) -> None:
    """With the serving process (`pid`) out of file descriptors, accepting fails (EMFILE)
    until some close: the log says so in one line, not a traceback every retry, and the
    connections that waited meanwhile are served once descriptors are free again."""
    port = port_of(server)
    loopback.get(server.base_url + "/health", timeout=HANG_GUARD)
    logged_before = len(server.log_path.read_bytes())
    limits = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    waiting = []
    try:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (open_fds(pid) + 4, limits[1]))
        for _ in range(16):
            waiting.append(socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD))
        deadline = time.monotonic() + HANG_GUARD
        while ACCEPT_FAILURE_LINE.encode() not in server.log_path.read_bytes()[logged_before:]:
            assert time.monotonic() < deadline, "the server never said it could not accept"
            time.sleep(0.1)
        time.sleep(1)  # about ten more failed attempts, which the log must not repeat
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, limits)
    for sock in waiting:  # accepted now: each is answered
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    for sock in waiting:
        with sock:
            reply = b""
            while chunk := sock.recv(65536):
                reply += chunk
            assert status(reply) == b"200", reply
    logged = server.log_path.read_bytes()[logged_before:].decode(errors="replace")
    assert logged.count(ACCEPT_FAILURE_LINE) == 1 and "EMFILE" in logged, logged
    assert "Traceback" not in logged and logged.count("EMFILE") == 1, logged


BURST = 600


def listen_overflows() -> int:
    """The kernel's count of connections dropped for a full listen queue (TcpExt
    ListenOverflows in /proc/net/netstat, this network namespace's). A dropped one is
    retried by the client's kernel a second later and may well connect then: this
    count, not the client's outcome, tells a queue that held every connection."""
    lines = Path("/proc/net/netstat").read_text().splitlines()
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            return int(dict(zip(names.split()[1:], values.split()[1:]))["ListenOverflows"])
    raise AssertionError("no TcpExt line in /proc/net/netstat")


def test_a_burst_of_connections_gets_no_connection_errors(server):
    assert_a_burst_of_connections_is_served(server)


def assert_a_burst_of_connections_is_served(server: RunningServer) -> None:
    """600 clients connecting at the same moment are all queued by the kernel and served
    (Hypercorn's own listen backlog of 100 dropped most of them)."""
    port = port_of(server)
    outcomes: Counter[str] = Counter()
    start = threading.Barrier(BURST)
    overflows = listen_overflows()

    def client() -> None:
        start.wait()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD) as sock:
                sock.settimeout(HANG_GUARD)
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                reply = b""
                while chunk := sock.recv(65536):
                    reply += chunk
            outcomes[status(reply).decode() if reply else "no reply"] += 1
        except OSError as error:
            outcomes[type(error).__name__] += 1

    clients = [threading.Thread(target=client) for _ in range(BURST)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    assert outcomes == {"200": BURST}, outcomes
    assert listen_overflows() == overflows


def test_the_hypercorn_settings_module_holds_settings_only():
    """Hypercorn takes every attribute of a `--config python:` module as a setting: the
    module holds Hypercorn settings and nothing else, and sets what `ovtrio serve` uses."""
    from hypercorn.config import Config

    import ovtrio.server.hypercorn_config as settings

    names = [name for name in dir(settings) if not name.startswith("__")]
    assert names and all(hasattr(Config, name) for name in names), names
    config = Config.from_object("ovtrio.server.hypercorn_config")
    assert (config.worker_class, config.backlog, config.keep_alive_timeout) == ("trio", 4096, 75)
    assert config.graceful_timeout > Config.graceful_timeout


HANGING_UP = 200


def test_clients_hanging_up_while_answered_leave_no_traceback(server):
    assert_clients_hanging_up_leave_no_traceback(server)


def assert_clients_hanging_up_leave_no_traceback(server: RunningServer) -> None:
    """Clients that send a request and hang up at once (shutting down their side, or
    closing) while the reply is being written: the server's end was closed with an EOF
    sent first, which held the socket's sending side while the reply's last write came,
    and Hypercorn logged an "Error in ASGI Framework" traceback for about one in ten."""
    port = port_of(server)
    logged_before = len(server.log_path.read_bytes())

    def hang_up(count: int) -> None:
        for index in range(count):
            with socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD) as sock:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                if index % 2:
                    sock.shutdown(socket.SHUT_WR)

    clients = [threading.Thread(target=hang_up, args=(HANGING_UP // 4,)) for _ in range(4)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    assert loopback.get(server.base_url + "/health", timeout=HANG_GUARD).status_code == 200
    time.sleep(0.5)  # the last connections' tasks end
    logged = server.log_path.read_bytes()[logged_before:].decode(errors="replace")
    assert "Traceback" not in logged and "Error in ASGI" not in logged, logged
