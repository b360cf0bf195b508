"""A burst of many small requests at once against the admission limits.

    python -m bench burst [--requests 2000] [--tokens 16] [--url http://127.0.0.1:8000]

Starts `ovtrio serve` (default settings, plus any --server-arg) unless --url names a
running server, then, in one run:

1. Unloaded: small completions one after another -> latency p50/p99.
2. Burst: `--requests` of the same completions at once, each on its own connection
   -> how many got 200 and 429, connection errors (resets, refused connects: must be
   none), the admitted requests' latency p50/p99 and their ratio to the unloaded run,
   how fast a 429 comes back, and the server's RSS before and after.

The load generator speaks HTTP/1.1 over raw trio sockets (`Connection: close`) and
reads only the status line and the body's length, to take little CPU from the server.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from dataclasses import dataclass

import trio

from bench.driver.results import Outcome
from bench.driver.server import metric_value, rss_mb, serving
from bench.driver.stats import percentile

MODEL = "SmolLM2-135M-Instruct"


@dataclass
class Reply:
    status: int  # 0: the connection failed
    seconds: float
    error: str = ""


def completion_request(host: str, model: str, tokens: int, index: int) -> bytes:
    body = json.dumps(
        {
            "model": model,
            "prompt": f"Request {index}: say hello.",
            "max_tokens": tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
    ).encode()
    return (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def send(host: str, port: int, request: bytes) -> Reply:
    started = time.perf_counter()
    try:
        stream = await trio.open_tcp_stream(host, port)
        async with stream:
            await stream.send_all(request)
            reply = b""
            while data := await stream.receive_some(65536):
                reply += data
    except OSError as exc:
        return Reply(0, time.perf_counter() - started, type(exc).__name__)
    elapsed = time.perf_counter() - started
    try:
        status = int(reply.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return Reply(0, elapsed, "no status line")
    return Reply(status, elapsed)


async def metric(host: str, port: int, name: str) -> float:
    return metric_value((await send_get(host, port, "/metrics")).decode(), name)


async def send_get(host: str, port: int, path: str) -> bytes:
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        reply = b""
        while data := await stream.receive_some(65536):
            reply += data
    return reply


async def burst(args: argparse.Namespace, host: str, port: int, pid: int | None) -> Outcome:
    make = lambda i: completion_request(host, args.model, args.tokens, i)  # noqa: E731
    for i in range(3):  # warm up
        await send(host, port, make(i))

    unloaded = []
    for i in range(args.unloaded):
        reply = await send(host, port, make(i))
        assert reply.status == 200, reply
        unloaded.append(reply.seconds)

    rss_before = rss_mb(pid) if pid else float("nan")
    rejected_before = await metric(host, port, "ovtrio_requests_rejected_total")
    replies: list[Reply] = []

    async def one(i: int) -> None:
        replies.append(await send(host, port, make(i)))

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(args.requests):
            nursery.start_soon(one, i)
    wall = time.perf_counter() - started
    rss_after = rss_mb(pid) if pid else float("nan")
    rejected = await metric(host, port, "ovtrio_requests_rejected_total") - rejected_before

    statuses = Counter(r.status for r in replies)
    errors = Counter(r.error for r in replies if r.status == 0)
    admitted = [r.seconds for r in replies if r.status == 200]
    refused = [r.seconds for r in replies if r.status == 429]
    p50, p99 = percentile(unloaded, 50), percentile(unloaded, 99)
    a50, a99 = percentile(admitted, 50), percentile(admitted, 99)
    print(
        f"ovtrio burst benchmark: {MODEL}, {args.tokens} output tokens per request,"
        " ignore_eos, greedy, unary completions"
    )
    print(f"unloaded ({args.unloaded} one after another): latency p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms")
    print(f"burst of {args.requests} at once, over {wall:.1f} s:")
    print(
        f"  200: {statuses.get(200, 0)}   429: {statuses.get(429, 0)}   other statuses: "
        f"{sum(v for k, v in statuses.items() if k not in (0, 200, 429))}   connection errors: "
        f"{statuses.get(0, 0)} {dict(errors) if errors else ''}"
    )
    print(
        f"  admitted latency p50 {a50 * 1000:.0f} ms, p99 {a99 * 1000:.0f} ms;"
        f" ratio to unloaded: p50 {a50 / p50:.1f}x, p99 {a99 / p99:.1f}x"
    )
    print(
        f"  429 latency p50 {percentile(refused, 50) * 1000:.0f} ms, p99 {percentile(refused, 99) * 1000:.0f} ms;"
        f" server counted {rejected:.0f} rejections"
    )
    print(f"  server RSS {rss_before:.0f} MB before, {rss_after:.0f} MB after")
    summary = {
        "unloaded p50 ms": p50 * 1000,
        "unloaded p99 ms": p99 * 1000,
        "200": statuses.get(200, 0),
        "429": statuses.get(429, 0),
        "connection errors": statuses.get(0, 0),
        "admitted p50 ms": a50 * 1000,
        "admitted p99 ms": a99 * 1000,
        "admitted p99 / unloaded p99": a99 / p99,
        "429 p99 ms": percentile(refused, 99) * 1000,
        "RSS before MB": rss_before,
        "RSS after MB": rss_after,
    }
    samples = {
        "unloaded_s": unloaded,
        "burst": [[r.status, r.seconds, r.error] for r in replies],
        "burst_wall_s": wall,
        "rejected_counted": rejected,
    }
    return Outcome(summary, samples)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--unloaded", type=int, default=20, help="requests of the unloaded run")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--url", help="a running server (default: start `ovtrio serve`)")
    parser.add_argument("--server-arg", action="append", default=[], help="extra `ovtrio serve` flag (repeatable)")


def run(args: argparse.Namespace) -> Outcome:
    if args.url:
        host, port = args.url.removeprefix("http://").rstrip("/").split(":")
        return trio.run(burst, args, host, int(port), None)
    with serving(["--log-level", "warning", *args.server_arg]) as server:
        return trio.run(burst, args, "127.0.0.1", server.port, server.pid)
