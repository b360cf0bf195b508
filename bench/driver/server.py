"""A server under test: `ovtrio serve` (or hypercorn) started on a free loopback port, waited for until
/health/ready answers 200, stopped when the scenario ends; and the small HTTP reads every
scenario makes of it (/v1/models, /metrics, the process's RSS and CPU time)."""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import trio

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    port: int
    process: subprocess.Popen
    launched: float  # time.perf_counter() just before the process started

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def rss_mb(self) -> float:
        return rss_mb(self.process.pid)


def start(
    flags: list[str],
    *,
    port: int | None = None,
    env: dict[str, str] | None = None,
    log: IO | None = None,
    cwd: Path | None = None,
) -> Server:
    """`ovtrio serve --port P *flags`, not yet ready; its output to `log` (default: none)."""
    port = port or free_port()
    launched = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "ovtrio", "serve", "--port", str(port), *flags],
        stdout=log or subprocess.DEVNULL,
        stderr=subprocess.STDOUT if log else subprocess.DEVNULL,
        env={**os.environ, **env} if env else None,
        cwd=cwd,
    )
    return Server(port, process, launched)


# The hypercorn command as the README gives it (the bind address added on its command line).
HYPERCORN = ("-m", "hypercorn", "-k", "trio", "--config", "python:ovtrio.server.hypercorn_config")


def start_hypercorn(env: dict[str, str], *, port: int | None = None, log: IO | None = None) -> Server:
    """`hypercorn -k trio ovtrio.app:app` on a free port, configured by `env` (OVTRIO_*
    variables) added to the environment, not yet ready; its output to `log`."""
    port = port or free_port()
    launched = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, *HYPERCORN, "-b", f"127.0.0.1:{port}", "ovtrio.app:app"],
        stdout=log or subprocess.DEVNULL,
        stderr=subprocess.STDOUT if log else subprocess.DEVNULL,
        env={**os.environ, **env},
    )
    return Server(port, process, launched)


def stop(process: subprocess.Popen, timeout: float = 60) -> None:
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextmanager
def serving(flags: list[str], *, ready_timeout: float = 300, **options) -> Iterator[Server]:
    """A started and ready `ovtrio serve` (see start()), stopped on leaving."""
    server = start(flags, **options)
    try:
        ready_by_http(server.port, lambda: server.process.poll() is None, ready_timeout)
        yield server
    finally:
        stop(server.process)


def ready_by_http(port: int, alive: Callable[[], bool], timeout: float = 300, path: str = "/health/ready") -> None:
    """Block until GET `path` answers 200 (readiness is 503 while the model loads), or
    fail once `alive()` says the server is gone or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError("the server exited before it was ready")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", path)
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.02)
    raise RuntimeError("the server did not become ready")


async def wait_ready(port: int, process: subprocess.Popen, path: bytes = b"/health/ready") -> None:
    """ready_by_http() for a scenario already inside trio.run."""
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
        except OSError:
            await trio.sleep(0.05)
            continue
        async with stream:
            await stream.send_all(b"GET " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            reply = b""
            while b"\r\n" not in reply and (data := await stream.receive_some(4096)):
                reply += data
        if reply.startswith(b"HTTP/1.1 200"):
            return
        await trio.sleep(0.05)


async def http_get(port: int, path: bytes) -> bytes:
    """The body of GET `path`, read until the server closes the connection."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(b"GET " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        reply = b""
        while data := await stream.receive_some(65536):
            reply += data
    return reply.split(b"\r\n\r\n", 1)[1]


async def http_request(port: int, request: bytes) -> bytes:
    """One request on its own connection; the reply, read up to its Content-Length (the
    server may keep the connection open after it)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        reply = b""
        while b"\r\n\r\n" not in reply and (data := await stream.receive_some(65536)):
            reply += data
        head, _, body = reply.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(body) < length and (data := await stream.receive_some(65536)):
            body += data
    return head + b"\r\n\r\n" + body


async def served_model_id(port: int) -> str:
    """The id of the first model the server lists."""
    import json

    return json.loads(await http_get(port, b"/v1/models"))["data"][0]["id"]


def metric_value(exposition: str, name: str) -> float:
    """A series' value in a Prometheus exposition: the unlabelled one, or with one model
    the one labelled model_name="..."; nan when absent."""
    for line in exposition.splitlines():
        if line.startswith((name + " ", name + "{")):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


async def metric(port: int, name: str) -> float:
    value = metric_value((await http_get(port, b"/metrics")).decode(), name)
    if value != value:
        raise KeyError(name)
    return value


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def resident_mb(pid: int) -> float:
    """Resident memory in MB of 10^6 bytes from /proc/PID/statm (the attacks and soak
    figures' unit; rss_mb() is in MiB, the serving and start figures' unit)."""
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 1e6


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
