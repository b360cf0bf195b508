"""Start time: `ovtrio serve` from process start to the first streamed token.

With an empty model cache (first start) and with the cache it left (second start).

    python -m bench start_time [--runs 3] [--model PATH] [--server-arg=--num-kv-blocks=64 ...]

Each run starts a server on a new, empty cache folder, then a second server on the
same folder. For each start: time to ready (/health/ready answers 200), time to the
first token of a streamed completion sent then, the load phases the server logs, and
its resident memory (RSS) after two idle seconds. Figures are medians over the runs;
each run's are printed too. Servers run one at a time; nothing else is measured.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import statistics
import tempfile
import time
from pathlib import Path

from bench.driver import server as servers
from bench.driver.results import Outcome
from bench.driver.server import free_port, ready_by_http, rss_mb

LOADED = re.compile(r"loaded in .*")


def first_token(port: int, model: str) -> None:
    """Send a streamed completion and return once its first token arrives."""
    body = json.dumps({"model": model, "prompt": "The capital of France is", "max_tokens": 4, "stream": True})
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"completion failed: {response.status} {response.read()[:200]!r}")
    while line := response.readline():
        if line.startswith(b"data: {") and json.loads(line[6:])["choices"][0]["text"]:
            connection.close()
            return
    raise RuntimeError("the stream ended without a token")


def model_id(port: int) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", "/v1/models")
    return json.loads(connection.getresponse().read())["data"][0]["id"]


def start_once(cache: Path, args: argparse.Namespace) -> dict[str, object]:
    port = free_port()
    log = cache.parent / f"server-{port}.log"
    flags = ["--cache-dir", str(cache), *args.server_arg]
    if args.model:
        flags += ["--model", args.model]
    with open(log, "w") as output:
        server = servers.start(flags, port=port, log=output)
    launched, process = server.launched, server.process
    try:
        ready_by_http(port, lambda: process.poll() is None)
        ready = time.perf_counter() - launched
        model = model_id(port)
        before_request = time.perf_counter()
        first_token(port, model)
        to_token = time.perf_counter() - launched
        time.sleep(2)
        rss = rss_mb(process.pid)
    finally:
        servers.stop(process, 30)
    found = LOADED.search(log.read_text())
    return {
        "ready_s": ready,
        "request_to_token_s": to_token - (before_request - launched),
        "start_to_token_s": to_token,
        "idle_rss_mb": rss,
        "phases": found.group(0) if found else "(no load line)",
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model", help="GGUF file or IR folder (default: the embedded model)")
    parser.add_argument("--server-arg", action="append", default=[], help="extra `ovtrio serve` flag (repeatable)")


def run(args: argparse.Namespace) -> Outcome:
    results: dict[str, list[dict[str, object]]] = {"first": [], "second": []}
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="ovtrio-start-") as folder:
            cache = Path(folder) / "cache"
            for which in ("first", "second"):
                result = start_once(cache, args)
                results[which].append(result)
                print(
                    f"run {run + 1} {which:6} start: ready {result['ready_s']:.2f} s, first token"
                    f" {result['start_to_token_s']:.2f} s, idle RSS {result['idle_rss_mb']:.0f} MB; {result['phases']}",
                    flush=True,
                )
    print(f"\novtrio start time, {args.runs} runs (medians), flags: {' '.join(args.server_arg) or 'defaults'}")
    summary: dict[str, float] = {}
    for which, label in (("first", "first start (empty cache)"), ("second", "second start (cache warm)")):
        rows = results[which]

        def median(key: str, rows: list[dict[str, object]] = rows) -> float:
            return statistics.median(float(row[key]) for row in rows)  # type: ignore[arg-type]

        print(
            f"{label:27} process start to ready {median('ready_s'):.2f} s, to first streamed token"
            f" {median('start_to_token_s'):.2f} s; idle RSS {median('idle_rss_mb'):.0f} MB"
        )
        summary[f"{which} start: to ready s"] = median("ready_s")
        summary[f"{which} start: to first token s"] = median("start_to_token_s")
        summary[f"{which} start: idle RSS MB"] = median("idle_rss_mb")
    return Outcome(summary, results)
