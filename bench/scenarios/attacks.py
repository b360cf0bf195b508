"""Hostile clients against one server: does it stay responsive and small?

    python -m bench attacks [--connections 3000] [--schemas 150] [--responses 60]
                            [--server-arg=--flag ...]

Starts `ovtrio serve` (default settings, plus any --server-arg) and runs, one after
another, the attacks below. During each, a prober asks `/health` every 20 ms on fresh
connections, and reads the server's resident memory (RSS); beside each attack the run
prints that probe's p99 (target: at most 50 ms), the RSS growth at its peak during the
attack and 5 s after it (the server returns free memory to the system within about
2 s of a grammar compiled; target for the grammar and store attacks, 5 s after: at most
100 MB), and what the attack's requests got back.

1. fd exhaustion: `--connections` TCP connections opened and closed at once by the
   client, then, 5 s later, the server's sockets still in CLOSE-WAIT (`ss`; target: at
   most 10).
2. Huge prompts: a 15 MB /tokenize body and a 15 MB chat body, two at once, three
   times; then the largest prompt the server still tokenizes (its character bound, in
   one message under the body limit), two at once.
3. Grammar cache: the four 100,000-string enum schemas of the original report (refused
   by size now), then `--schemas` distinct enum schemas as large as the server takes
   (each compiles to a grammar kept in the engine's cache), after one warm-up schema
   that pays for the compiler's own start-up memory.
4. Response store: `--responses` stored responses carrying ~10 MB (the original
   report) or ~1.8 MB of metadata each (refused now), the same number with the largest metadata
   OpenAI allows and long inputs, then DELETE of every one stored; RSS after DELETE.

The server's own /health answers in well under a millisecond; p99 above that is time
the event loop was held by something else (or, on a loaded machine, the CPU was).
"""

from __future__ import annotations

import argparse
import json
import socket
import string
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import httpx

from bench.driver import server as servers
from bench.driver.hardware import cpu_name
from bench.driver.results import ROOT, Outcome
from bench.driver.server import Server, metric_value, resident_mb
from bench.driver.stats import percentile

MODEL = "SmolLM2-135M-Instruct"
HEALTH_TARGET_MS = 50.0
CLOSE_WAIT_TARGET = 10
RSS_TARGET_MB = 100.0


# The prober's process runs probe() below.
PROBE = "import sys; from bench.scenarios.attacks import probe; probe(sys.argv[1], int(sys.argv[2]))"


class HealthProbe:
    """Asks /health every 20 ms, each time on a new connection, from a process of its
    own (so that the attacks' own work in this process, such as encoding a 15 MB body,
    does not delay the probe), and keeps the latencies (a failed probe counts as 10 s)."""

    def __init__(self, base_url: str, server_pid: int) -> None:
        self.base_url = base_url
        self.server_pid = server_pid
        self.latencies: list[float] = []
        self.peak_rss_mb = 0.0
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> HealthProbe:
        self._process = subprocess.Popen(
            [sys.executable, "-c", PROBE, self.base_url, str(self.server_pid)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._process.stdout is not None
        self._process.stdout.readline()  # started
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._process is not None
        output, _ = self._process.communicate("stop\n", timeout=60)
        self.latencies, self.peak_rss_mb = json.loads(output)

    def p99_ms(self) -> float:
        return percentile(self.latencies, 99) * 1000

    def max_ms(self) -> float:
        return max(self.latencies, default=float("nan")) * 1000


def probe(base_url: str, server_pid: int) -> None:
    """The prober's process: probe until told to stop on stdin, then print the latencies
    and the server's peak RSS (read at each probe)."""
    stop = threading.Event()
    peak = 0.0
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    latencies: list[float] = []
    print("started", flush=True)
    with httpx.Client(timeout=10, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                ok = client.get(base_url + "/health").status_code == 200
            except httpx.HTTPError:
                ok = False
            latencies.append(time.perf_counter() - started if ok else 10.0)
            with open(f"/proc/{server_pid}/statm") as file:
                peak = max(peak, int(file.read().split()[1]) * 4096 / 1e6)
            stop.wait(0.02)
    print(json.dumps([latencies, peak]), flush=True)


# Free memory is returned to the system every 2 s (ovtrio/serving/memory.py): RSS is read again
# after this long, beside its peak during the attack.
SETTLE_SECONDS = 5.0


@dataclass
class Result:
    name: str
    health_p99_ms: float
    health_max_ms: float
    probes: int
    rss_before: float
    rss_peak: float
    rss_after: float
    notes: list[str] = field(default_factory=list)
    rss_target: bool = False

    def line(self) -> str:
        growth = self.rss_after - self.rss_before
        health = "ok" if self.health_p99_ms <= HEALTH_TARGET_MS else "OVER"
        rss = "" if not self.rss_target else (" ok" if growth <= RSS_TARGET_MB else " OVER")
        return (
            f"{self.name:<14} /health p99 {self.health_p99_ms:7.1f} ms ({health} <= {HEALTH_TARGET_MS:.0f}),"
            f" max {self.health_max_ms:7.1f} ms, {self.probes} probes | RSS {self.rss_before:4.0f} MB, peak"
            f" {self.rss_peak - self.rss_before:+4.0f}, {SETTLE_SECONDS:.0f} s after {growth:+4.0f}{rss} | "
            + "; ".join(self.notes)
        )


def attack(server: Server, name: str, run, rss_target: bool = False) -> Result:
    before = resident_mb(server.pid)
    with HealthProbe(server.base_url, server.process.pid) as probe:
        notes = run()
    time.sleep(SETTLE_SECONDS)
    return Result(
        name,
        probe.p99_ms(),
        probe.max_ms(),
        len(probe.latencies),
        before,
        max(probe.peak_rss_mb, before),
        resident_mb(server.pid),
        notes,
        rss_target,
    )


def statuses(responses: list[httpx.Response | Exception]) -> str:
    counts: dict[str, int] = {}
    for response in responses:
        key = str(response.status_code) if isinstance(response, httpx.Response) else type(response).__name__
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{count} x {key}" for key, count in sorted(counts.items()))


def at_once(*calls) -> list[httpx.Response | Exception]:
    results: list[httpx.Response | Exception] = [None] * len(calls)  # type: ignore[list-item]

    def run(i: int, call) -> None:
        try:
            results[i] = call()
        except Exception as exc:  # noqa: BLE001 - a refused or cut connection is a result here
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


# ---- the attacks ------------------------------------------------------------------------------


def close_wait(server: Server) -> int:
    listing = subprocess.run(
        ["ss", "-Htan", "state", "close-wait", f"( sport = :{server.port} )"], capture_output=True, text=True
    ).stdout
    return len([line for line in listing.splitlines() if line.strip()])


def fd_exhaustion(server: Server, connections: int) -> list[str]:
    before = close_wait(server)
    started = time.perf_counter()
    for _ in range(connections):
        socket.create_connection(("127.0.0.1", server.port)).close()
    opened = time.perf_counter() - started
    time.sleep(5)
    waiting = close_wait(server)
    verdict = "ok" if waiting <= CLOSE_WAIT_TARGET else "OVER"
    return [
        f"{connections} open/close in {opened:.1f} s",
        f"CLOSE-WAIT after 5 s: {waiting} ({verdict} <= {CLOSE_WAIT_TARGET}; {before} before, the probe's included)",
    ]


def huge_prompts(server: Server, client: httpx.Client, limit_chars: int) -> list[str]:
    huge = "a" * 15_000_000
    notes = []
    for _ in range(3):
        started = time.perf_counter()
        replies = at_once(
            lambda: client.post(server.base_url + "/tokenize", json={"prompt": huge}),
            lambda: client.post(
                server.base_url + "/v1/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": huge}], "max_tokens": 1},
            ),
        )
        notes.append(f"15 MB x2: {statuses(replies)} in {time.perf_counter() - started:.2f} s")
    # The longest text the server still tokenizes: a word and a space repeated.
    longest = "hello " * (limit_chars // 6)
    started = time.perf_counter()
    replies = at_once(
        lambda: client.post(server.base_url + "/tokenize", json={"prompt": longest}),
        lambda: client.post(server.base_url + "/tokenize", json={"messages": [{"role": "user", "content": longest}]}),
    )
    notes.append(f"{len(longest)} chars x2 tokenized: {statuses(replies)} in {time.perf_counter() - started:.2f} s")
    return notes


def short_strings(count: int, tag: str) -> list[str]:
    digits = string.digits + string.ascii_lowercase
    values = []
    for i in range(count):
        text = ""
        while True:
            text, i = digits[i % 36] + text, i // 36
            if not i:
                break
        values.append(tag + text)
    return values


def largest_enum(tag: str, max_bytes: int) -> dict:
    """An enum schema of short strings, as many as fit in `max_bytes` of compact JSON."""
    count = max_bytes // 6
    while True:
        schema = {"type": "string", "enum": short_strings(count, tag)}
        if len(json.dumps(schema, separators=(",", ":"))) <= max_bytes:
            return schema
        count -= 200


def constrained(client: httpx.Client, server: Server, schema: dict) -> httpx.Response:
    return client.post(
        server.base_url + "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "Pick one."}],
            "max_tokens": 2,
            "response_format": {"type": "json_schema", "json_schema": {"name": "pick", "schema": schema}},
        },
    )


def grammar_cache(server: Server, client: httpx.Client, schemas: int, max_schema_bytes: int) -> list[str]:
    reported = at_once(
        *[
            lambda k=k: constrained(client, server, {"type": "string", "enum": [f"v{k}_{i}" for i in range(100_000)]})
            for k in range(4)
        ]
    )
    replies = []
    started = time.perf_counter()
    for k in range(schemas):
        replies.append(constrained(client, server, largest_enum(f"{k}-", max_schema_bytes)))
    held = metric(client, server, "ovtrio_grammar_cache_bytes")
    return [
        f"4 x 100,000-string enums: {statuses(reported)}",
        f"{schemas} distinct {max_schema_bytes // 1024} KB enums: {statuses(replies)}"
        f" in {time.perf_counter() - started:.0f} s",
        f"cache holds {held / 1e6:.1f} MB",
    ]


def metric(client: httpx.Client, server: Server, name: str) -> float:
    return metric_value(client.get(server.base_url + "/metrics").text, name)


def response_store(server: Server, client: httpx.Client, count: int) -> tuple[list[str], float]:
    reported = [
        client.post(
            server.base_url + "/v1/responses",
            json={"model": MODEL, "input": "Hi", "max_output_tokens": 1, "metadata": metadata},
        )
        for metadata in (
            {f"k{i}": "x" * 650_000 for i in range(16)},  # ~10 MB, as reported: over the body limit
            {f"k{i}": "x" * 110_000 for i in range(16)},
        )  # ~1.8 MB, under it: checked as OpenAI does
        for _ in range(count // 2)
    ]
    largest_allowed = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}
    long_input = ("\n" + " " * 39) * 400  # 16,000 characters in 400 tokens
    stored = []
    for _ in range(count):
        reply = client.post(
            server.base_url + "/v1/responses",
            json={"model": MODEL, "input": long_input, "max_output_tokens": 1, "metadata": largest_allowed},
        )
        stored.append(reply)
    held = metric(client, server, "ovtrio_response_store_bytes")
    before_delete = resident_mb(server.pid)
    deleted = [
        client.delete(f"{server.base_url}/v1/responses/{reply.json()['id']}")
        for reply in stored
        if reply.status_code == 200
    ]
    return [
        f"{count} x 10 MB or 1.8 MB metadata: {statuses(reported)}",
        f"{count} x largest metadata + 16 KB input: {statuses(stored)}, store {held / 1e6:.1f} MB",
        f"DELETE: {statuses(deleted)}, store {metric(client, server, 'ovtrio_response_store_bytes') / 1e6:.1f} MB",
    ], before_delete


def store_attack(server: Server, client: httpx.Client, count: int) -> Result:
    before_delete: list[float] = []

    def run() -> list[str]:
        notes, rss = response_store(server, client, count)
        before_delete.append(rss)
        return notes

    result = attack(server, "response store", run, rss_target=True)
    result.notes.append(
        f"RSS before DELETE {before_delete[0]:.0f} MB, {SETTLE_SECONDS:.0f} s after {result.rss_after:.0f} MB"
    )
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--connections", type=int, default=3000)
    parser.add_argument("--schemas", type=int, default=150)
    parser.add_argument("--responses", type=int, default=60)
    parser.add_argument("--max-schema-bytes", type=int, default=64 * 1024, help="the server's --max-schema-bytes")
    parser.add_argument("--server-arg", action="append", default=[], help="extra `ovtrio serve` flag (repeatable)")
    parser.add_argument("--only", default="fd,huge,grammar,store", help="the attacks to run, comma-separated")


def run(options: argparse.Namespace) -> Outcome:
    server = servers.start(options.server_arg)
    servers.ready_by_http(server.port, lambda: server.process.poll() is None)
    results: list[Result] = []
    try:
        with httpx.Client(timeout=600, limits=httpx.Limits(max_keepalive_connections=0)) as client:
            limit_chars = probe_character_bound(client, server)
            results.append(attack(server, "idle", lambda: time.sleep(3) or []))
            only = set(options.only.split(","))
            if "fd" in only:
                results.append(attack(server, "fd exhaustion", lambda: fd_exhaustion(server, options.connections)))
            if "huge" in only:
                results.append(attack(server, "huge prompts", lambda: huge_prompts(server, client, limit_chars)))
            if "grammar" in only:
                constrained(client, server, largest_enum("warm-up-", options.max_schema_bytes))
                results.append(
                    attack(
                        server,
                        "grammar cache",
                        lambda: grammar_cache(server, client, options.schemas, options.max_schema_bytes),
                        rss_target=True,
                    )
                )
            if "store" in only:
                results.append(store_attack(server, client, options.responses))
    finally:
        servers.stop(server.process)

    model = cpu_name()
    print(f"attacks on {model}, ovtrio serve {' '.join(options.server_arg)}".rstrip())
    print(f"prompt character bound: {limit_chars}")
    for result in results:
        print(result.line())
    summary: dict[str, float | str] = {"prompt character bound": limit_chars}
    for result in results:
        summary[f"{result.name}: /health p99 ms"] = result.health_p99_ms
        summary[f"{result.name}: /health max ms"] = result.health_max_ms
        summary[f"{result.name}: RSS growth 5 s after MB"] = result.rss_after - result.rss_before
    samples = [
        {
            "name": r.name,
            "health_p99_ms": r.health_p99_ms,
            "health_max_ms": r.health_max_ms,
            "probes": r.probes,
            "rss_before_mb": r.rss_before,
            "rss_peak_mb": r.rss_peak,
            "rss_after_mb": r.rss_after,
            "notes": r.notes,
        }
        for r in results
    ]
    return Outcome(summary, samples)


def probe_character_bound(client: httpx.Client, server: Server) -> int:
    """The server's character bound, read from the message it refuses a too-long prompt with."""
    reply = client.post(server.base_url + "/tokenize", json={"prompt": "a" * 1_900_000}).json()
    message = reply.get("error", {}).get("message", "")
    numbers = [int(word) for word in message.replace(",", " ").split() if word.isdigit()]
    return numbers[1] if len(numbers) > 1 else 600_000
