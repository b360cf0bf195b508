"""What a model's load costs, now that a load is a request's latency (models on demand).

    python -m bench model_load [--runs 3] [--model PATH] [--server-arg=--flag ...]

Three measurements, each `--runs` times (medians reported, each run printed):

1. The load's parts, in a fresh process per run: tokenizer, model (the engine reading
   and compiling it), vocabulary and warm-up, as the server logs them, with the model
   cache warm; without and with OpenVINO's compile cache (CACHE_DIR, --compile-cache),
   whose first run fills it. "total" is the load's wall time in that process, the
   engine's import included; "vocabulary" is what remained of its reading once the
   engine had compiled (the rest runs meanwhile).
2. `ovtrio serve` from process start to the first streamed token, the model cached.
3. A `--models-dir` server (the model linked into a folder): from a request for the
   unloaded model to its first streamed token, the model unloaded between runs
   (POST /models/unload); without and with --compile-cache.

Figures are medians over the runs; each run's are printed too.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.driver.results import Outcome
from bench.driver.server import free_port, ready_by_http
from bench.scenarios.start_time import first_token

PHASES_SCRIPT = """
import json, sys
from ovtrio.model import load_and_warm_up, resolve_model
from ovtrio.settings.server import settings_from_env
overrides = json.loads(sys.argv[1])
settings = settings_from_env(**overrides)
model, _ = load_and_warm_up(resolve_model(settings), settings)
print(json.dumps({**model.phases, "total": model.load_seconds}))
"""


def load_phases(cache: Path, model: str | None, compile_cache: bool) -> dict[str, float]:
    """The phases of one load in a process of its own."""
    overrides: dict[str, Any] = {"cache_dir": str(cache), "compile_cache": compile_cache, "num_kv_blocks": 64}
    if model:
        overrides["model"] = model
    done = subprocess.run(
        [sys.executable, "-c", PHASES_SCRIPT, json.dumps(overrides)], capture_output=True, text=True, check=True
    )
    phases: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return phases


def _post(port: int, path: str, body: dict[str, Any]) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"{path}: {response.status} {response.read()[:200]!r}")
    response.read()


def serve_to_first_token(cache: Path, model: str | None, server_args: list[str]) -> float:
    port = free_port()
    command = [sys.executable, "-m", "ovtrio", "serve", "--port", str(port), "--cache-dir", str(cache)]
    command += ["--model", model] if model else []
    launched = time.perf_counter()
    process = subprocess.Popen([*command, *server_args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ready_by_http(port, lambda: process.poll() is None)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("GET", "/v1/models")
        name = json.loads(connection.getresponse().read())["data"][0]["id"]
        first_token(port, name)
        return time.perf_counter() - launched
    finally:
        process.terminate()
        process.wait(timeout=30)


def first_requests(
    cache: Path, model: str | None, server_args: list[str], runs: int, compile_cache: bool
) -> list[float]:
    """Seconds from a request for an unloaded model of a --models-dir server to its
    first token, `runs` times (the model unloaded before each)."""
    from ovtrio.model import embedded_model_path

    with tempfile.TemporaryDirectory(prefix="ovtrio-models-") as folder:
        source = Path(model) if model else embedded_model_path()
        name = "on-demand"
        (Path(folder) / (f"{name}.gguf" if source.is_file() else name)).symlink_to(source.resolve())
        port = free_port()
        command = [sys.executable, "-m", "ovtrio", "serve", "--port", str(port), "--cache-dir", str(cache)]
        command += ["--models-dir", folder, "--no-embeddings", *server_args]
        command += ["--compile-cache"] if compile_cache else []
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            ready_by_http(port, lambda: process.poll() is None)
            times = []
            for _ in range(runs):
                began = time.perf_counter()
                first_token(port, name)
                times.append(time.perf_counter() - began)
                _post(port, "/models/unload", {"model": name})
            return times
        finally:
            process.terminate()
            process.wait(timeout=30)


def run(args: argparse.Namespace) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="ovtrio-load-") as folder:
        cache = Path(folder) / "cache"
        load_phases(cache, args.model, False)  # converts a GGUF file into this cache
        phases: dict[str, list[dict[str, float]]] = {"plain": [], "compile_cache": []}
        load_phases(cache, args.model, True)  # fills the compile cache
        for _ in range(args.runs):
            for which in phases:
                phases[which].append(load_phases(cache, args.model, which == "compile_cache"))
                print(which, {k: round(v, 2) for k, v in phases[which][-1].items()}, flush=True)
        starts = [serve_to_first_token(cache, args.model, args.server_arg) for _ in range(args.runs)]
        print("serve to first token", [round(s, 2) for s in starts], flush=True)
        first = {
            which: first_requests(cache, args.model, args.server_arg, args.runs, which == "compile_cache")
            for which in ("plain", "compile_cache")
        }
        print("first request to first token", {k: [round(s, 2) for s in v] for k, v in first.items()}, flush=True)

    def medians(rows: list[dict[str, float]]) -> dict[str, float]:
        return {key: round(statistics.median(row[key] for row in rows), 3) for key in rows[0]}

    load = {which: medians(rows) for which, rows in phases.items()}
    summary: dict[str, Any] = {}
    for which, label in (("plain", ""), ("compile_cache", ", compile cache")):
        for phase, seconds in load[which].items():
            summary[f"load: {phase} s{label}"] = seconds
    summary["serve to first token s"] = round(statistics.median(starts), 3)
    summary["first request to first token s"] = round(statistics.median(first["plain"]), 3)
    summary["first request to first token s, compile cache"] = round(statistics.median(first["compile_cache"]), 3)
    return Outcome(summary, {"runs": args.runs, "load_phases_s": phases, "serve_s": starts, "first_request_s": first})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model", help="GGUF file or IR folder (default: the embedded model)")
    parser.add_argument("--server-arg", action="append", default=[], help="extra `ovtrio serve` flag (repeatable)")
