"""What the HTTP stack itself costs a request: ovtrio beside a bare Quart-Trio app.

    python -m bench http_floor [--requests 500] [--rounds 3]

One keep-alive client (a raw socket, its request bytes built beforehand) sends requests
one after the other to:

- ovtrio (`ovtrio serve`, the embedded models): `GET /health`, and `POST /v1/embeddings`
  of one short text;
- a Quart-Trio app with one route answering the same `/health` JSON, under
  `hypercorn -k trio`: the stack ovtrio is built on, with nothing of ovtrio in it.

For each it prints requests a second and the CPU the server's processes spent per
request (all their threads: for embeddings that includes the model's), medians of
`--rounds` rounds taken in turns, and ovtrio's /health CPU over the bare app's. A figure
that matters for batching: a server whose event loop spends this much per request
cannot answer requests faster than one per that many microseconds of one core, however
the model batches them.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

from bench.driver import server as servers
from bench.driver.hardware import cpu_name
from bench.driver.results import Outcome
from bench.driver.server import cpu_seconds, free_port, wait_ready

BARE_APP = """
from quart_trio import QuartTrio

app = QuartTrio(__name__)


@app.get("/health")
async def health():
    return {"status": "ok"}
"""


def process_tree_cpu_ns(pid: int) -> int:
    """CPU time of `pid` and its children (Hypercorn serves from a child), all their
    threads, in ns."""
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return round(1e9 * sum(cpu_seconds(process) for process in [pid, *map(int, children)]))


def request_bytes(port: int, path: str, body: dict | None = None) -> bytes:
    head = f"{'POST' if body else 'GET'} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
    if body is None:
        return (head + "\r\n").encode()
    data = json.dumps(body).encode()
    return (head + f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n").encode() + data


def exchange(connection: socket.socket, request: bytes) -> None:
    """One request and its whole reply (Content-Length framed)."""
    connection.sendall(request)
    received = b""
    while True:
        data = connection.recv(65536)
        if not data:
            raise RuntimeError("connection closed")
        received += data
        head, blank, rest = received.partition(b"\r\n\r\n")
        if blank:
            length = next(
                int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
            )
            if len(rest) >= length:
                if not head.startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(head.decode(errors="replace"))
                return


def measure(pid: int, port: int, request: bytes, count: int) -> tuple[float, float]:
    """Requests a second and CPU microseconds a request, over one connection (Hypercorn
    closes a keep-alive connection after 1000 requests: keep `count` below)."""
    with socket.create_connection(("127.0.0.1", port)) as connection:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(20):
            exchange(connection, request)
        cpu = process_tree_cpu_ns(pid)
        started = time.perf_counter()
        for _ in range(count):
            exchange(connection, request)
        elapsed = time.perf_counter() - started
        return count / elapsed, (process_tree_cpu_ns(pid) - cpu) / count / 1e3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=500, help="requests per round and case (under 1000)")
    parser.add_argument("--rounds", type=int, default=3)


def run(args: argparse.Namespace) -> Outcome:
    folder = Path(tempfile.mkdtemp(prefix="bench-bare-"))
    (folder / "bare_app.py").write_text(BARE_APP)
    ours_port, bare_port = free_port(), free_port()
    started = [
        servers.start(["--log-level", "warning", "--encoder-preload"], port=ours_port).process,
        subprocess.Popen(
            [sys.executable, "-m", "hypercorn", "-k", "trio", "-b", f"127.0.0.1:{bare_port}", "bare_app:app"],
            cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ),
    ]  # fmt: skip
    try:
        trio.run(wait_ready, ours_port, started[0], b"/health/ready")
        trio.run(wait_ready, bare_port, started[1], b"/health")
        embedding = {"model": "all-MiniLM-L6-v2", "input": "A man is eating food."}
        cases = {
            "bare Quart-Trio, GET /health": (started[1].pid, bare_port, request_bytes(bare_port, "/health")),
            "ovtrio, GET /health": (started[0].pid, ours_port, request_bytes(ours_port, "/health")),
            "ovtrio, POST /v1/embeddings (1 text)": (
                started[0].pid, ours_port, request_bytes(ours_port, "/v1/embeddings", embedding),
            ),
        }  # fmt: skip
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
        for _ in range(args.rounds):
            for name, (pid, port, request) in cases.items():
                results[name].append(measure(pid, port, request, args.requests))
    finally:
        for server in started:
            servers.stop(server, 30)
    cpu = cpu_name()
    print(
        f"one keep-alive client, {args.requests} requests a round, medians of {args.rounds};"
        f" {cpu}, {os.cpu_count()} cores"
    )
    print(f"{'case':<40} {'req/s':>7} {'server CPU/request':>19}")
    medians = {}
    for name, values in results.items():
        rate, cpu_us = statistics.median(v[0] for v in values), statistics.median(v[1] for v in values)
        medians[name] = cpu_us
        print(f"{name:<40} {rate:>7.0f} {cpu_us:>16.0f} us")
    ratio = medians["ovtrio, GET /health"] / medians["bare Quart-Trio, GET /health"]
    print(f"ovtrio's /health CPU over the bare app's: {ratio:.2f}")
    summary: dict[str, float] = {}
    for name, values in results.items():
        summary[f"{name}: req/s"] = statistics.median(v[0] for v in values)
        summary[f"{name}: server CPU us/request"] = medians[name]
    summary["ovtrio /health CPU / bare app's"] = ratio
    return Outcome(summary, results)
