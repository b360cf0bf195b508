"""New schemas and new sampling settings: does /health stay fast while they keep coming?

Does the server stay responsive while clients keep sending output constraints and
sampling settings it has never seen?

    python -m bench new_schemas [--seconds 20] [--rate 4] [--phases baseline schemas prefills settings]
        [--server-arg FLAG ...]

Each new constraint is compiled before admission, in a worker process
(ovtrio/constraints/check.py), and every engine step releases the GIL, a request's
first step included (ovtrio/scheduler/stepping.py). What this measures, on one server
started here with the embedded model:

- baseline: 3 background streams decode (streaming chat, greedy, ignore_eos; each
  restarts when it ends) while /health is probed every 10 ms (each probe on its own
  connection, fired on time whether or not the last one was answered) for `--seconds`;
- new schemas: the same, plus `--rate` chat requests a second, each with a JSON schema
  of about 800 bytes that no request had before (distinct property names);
- new settings: 8 streams with long prompts (about 1,500 tokens, never the same, so
  nothing comes from the prefix cache) and sampling settings no request had before
  (max_tokens, temperature, top_k), each restarting when it ends, with the same probes;
  `--phases ... prefills` runs the same with the same settings throughout, to tell the
  long prompts' cost from the new settings'.

Printed: /health p50/p99/max per phase, the background streams' gap between chunks
(p99), and the schema requests' status counts and latency. The goals: /health p99 at
most 50 ms with new schemas, and /health max at most 20 ms with new settings. The
machine is shared by whatever else runs on it: figures are noisy, run it more than
once before reading much into one.
"""

from __future__ import annotations

import argparse
import json
import random
import string
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from bench.driver import server as servers
from bench.driver.requests import stream_chat
from bench.driver.results import Outcome
from bench.driver.server import http_get, served_model_id
from bench.driver.stats import percentile

PROBE_INTERVAL = 0.010
BACKGROUND_STREAMS = 3
SETTINGS_STREAMS = 8
STREAM_TOKENS = 200


@dataclass
class Phase:
    health_ms: list[float] = field(default_factory=list)
    gaps_ms: list[float] = field(default_factory=list)
    requests_ms: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)


def new_schema(rng: random.Random) -> dict[str, Any]:
    """A JSON schema of about 800 bytes that no other call returns (random property
    names), every value bounded."""
    properties: dict[str, Any] = {}
    while len(json.dumps(properties)) < 700:
        name = "".join(rng.choices(string.ascii_lowercase, k=10))
        kind = rng.choice(["enum", "integer", "string", "boolean"])
        if kind == "enum":
            properties[name] = {"enum": ["".join(rng.choices(string.ascii_lowercase, k=6)) for _ in range(3)]}
        elif kind == "integer":
            properties[name] = {"type": "integer", "minimum": 0, "maximum": rng.randint(10, 9999)}
        elif kind == "string":
            properties[name] = {"type": "string", "maxLength": rng.randint(4, 16)}
        else:
            properties[name] = {"type": "boolean"}
    return {"type": "object", "properties": properties, "required": list(properties)[:3]}


def post(path: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nConnection: close\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode() + data


async def exchange(port: int, request: bytes) -> tuple[int, bytes]:
    """(status, whole reply) of one request on its own connection (read to its close)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        reply = b""
        while data := await stream.receive_some(65536):
            reply += data
    return int(reply.split(b" ", 2)[1]), reply


async def probes(port: int, phase: Phase, stop: trio.Event) -> None:
    async def probe() -> None:
        started = time.perf_counter()
        await http_get(port, b"/health")
        phase.health_ms.append((time.perf_counter() - started) * 1e3)

    async with trio.open_nursery() as nursery:
        next_probe = time.perf_counter()
        while not stop.is_set():
            nursery.start_soon(probe)
            next_probe += PROBE_INTERVAL
            with trio.move_on_at(trio.current_time() + max(0.0, next_probe - time.perf_counter())):
                await stop.wait()


async def background(port: int, model: str, index: int, phase: Phase, stop: trio.Event) -> None:
    while not stop.is_set():
        result = await stream_chat(port, model, f"Tell me story number {index}.", STREAM_TOKENS)
        phase.gaps_ms += [gap * 1e3 for gap in result.inter_token]


async def schema_requests(port: int, model: str, rate: float, phase: Phase, stop: trio.Event) -> None:
    rng = random.Random(7)

    async def one(schema: dict[str, Any]) -> None:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "Fill in the record."}],
            "max_tokens": 24,
            "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "record", "schema": schema}},
        }
        started = time.perf_counter()
        status, _ = await exchange(port, post("/v1/chat/completions", body))
        phase.requests_ms.append((time.perf_counter() - started) * 1e3)
        phase.statuses[status] = phase.statuses.get(status, 0) + 1

    async with trio.open_nursery() as nursery:
        while not stop.is_set():
            nursery.start_soon(one, new_schema(rng))
            with trio.move_on_after(1 / rate):
                await stop.wait()


async def settings_stream(
    port: int, model: str, index: int, phase: Phase, stop: trio.Event, fresh: bool = True
) -> None:
    """A stream of long-prompt requests, each with sampling settings no request had
    before (`fresh`), or all with the same settings."""
    rng = random.Random(index if fresh else 0)
    n = index
    while not stop.is_set():
        words = " ".join(f"w{n}x{i}" for i in range(700))  # about 1,500 tokens, new each time
        body = {
            "model": model,
            "messages": [{"role": "user", "content": f"Summarize: {words}"}],
            "max_tokens": rng.randint(16, 48) if fresh else 32,
            "temperature": round(rng.uniform(0.2, 1.5), 3) if fresh else 0.7,
            "top_k": rng.randint(2, 80) if fresh else 40,
            "ignore_eos": True,
            "stream": True,
        }
        status, _ = await exchange(port, post("/v1/chat/completions", body))
        phase.statuses[status] = phase.statuses.get(status, 0) + 1
        n += SETTINGS_STREAMS


async def run_phase(port: int, model: str, seconds: float, kind: str, rate: float) -> Phase:
    phase = Phase()
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        if kind in ("settings", "prefills"):
            for i in range(SETTINGS_STREAMS):
                nursery.start_soon(settings_stream, port, model, i, phase, stop, kind == "settings")
        else:
            for i in range(BACKGROUND_STREAMS):
                nursery.start_soon(background, port, model, i, phase, stop)
        await trio.sleep(2)  # the streams are running
        nursery.start_soon(probes, port, phase, stop)
        if kind == "schemas":
            nursery.start_soon(schema_requests, port, model, rate, phase, stop)
        await trio.sleep(seconds)
        stop.set()
    return phase


def row(name: str, phase: Phase) -> str:
    health = phase.health_ms
    gaps = f"{percentile(phase.gaps_ms, 99):>8.1f}ms" if phase.gaps_ms else f"{'-':>10}"
    requests = (
        f" {percentile(phase.requests_ms, 50):>8.0f}ms {percentile(phase.requests_ms, 99):>7.0f}ms"
        if phase.requests_ms
        else f" {'-':>10} {'-':>9}"
    )
    statuses = ", ".join(f"{status}: {count}" for status, count in sorted(phase.statuses.items())) or "-"
    return (
        f"{name:>12} {percentile(health, 50):>8.1f}ms {percentile(health, 99):>7.1f}ms {max(health):>7.1f}ms"
        f" {len(health):>6} {gaps}{requests}  {statuses}"
    )


async def measure(args: argparse.Namespace, port: int) -> dict[str, Phase]:
    model = await served_model_id(port)
    await stream_chat(port, model, "Hello!", 2)  # the first request compiles kernels
    return {kind: await run_phase(port, model, args.seconds, kind, args.rate) for kind in args.phases}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=4.0, help="new schemas a second")
    parser.add_argument("--log", default="/tmp/ovtrio-new-schemas.log")
    parser.add_argument(
        "--phases",
        nargs="+",
        choices=["baseline", "schemas", "prefills", "settings"],
        default=["baseline", "schemas", "settings"],
    )
    parser.add_argument("--server-arg", action="append", default=[], help="extra `ovtrio serve` flag (repeatable)")


def run(args: argparse.Namespace) -> Outcome:
    with open(Path(args.log), "w") as log, servers.serving(args.server_arg, log=log) as server:
        phases = trio.run(measure, args, server.port)
    print(
        f"{args.seconds:g} s a phase, /health every {PROBE_INTERVAL * 1e3:.0f} ms; {BACKGROUND_STREAMS} background"
        f" streams; new schemas at {args.rate:g}/s; new settings on {SETTINGS_STREAMS} long-prompt streams"
    )
    print(
        f"{'phase':>12} {'health p50':>10} {'p99':>9} {'max':>9} {'probes':>6} {'gap p99':>10}"
        f" {'req p50':>10} {'p99':>9}  statuses"
    )
    names = {"baseline": "baseline", "schemas": "new schemas", "prefills": "same settings", "settings": "new settings"}
    summary = {}
    for kind, phase in phases.items():
        print(row(names[kind], phase))
        summary[f"{names[kind]}: /health p99 ms"] = percentile(phase.health_ms, 99)
        summary[f"{names[kind]}: /health max ms"] = max(phase.health_ms)
    return Outcome(summary, {kind: vars(phase) for kind, phase in phases.items()})
