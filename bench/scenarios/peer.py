"""ovtrio against llama.cpp's llama-server: the same GGUF, the same workload, interleaved.

    python -m bench.build_llama_server     # once: builds the peer (5-10 min on 2 cores)
    python -m bench.make_tiny_llama /tmp/tiny-llama-q4_0.gguf   # the 1B-class fixture
    python -m bench peer [--model embedded /tmp/tiny-llama-q4_0.gguf] [--concurrency 1 4 16]
                         [--tokens 64] [--turns 5] [--isa avx2]

Both servers run each GGUF given (default: the embedded SmolLM2-135M-Instruct Q4_1) on
the CPU: `ovtrio serve --model <gguf>` with its defaults, `llama-server -np 32 -c 32768
-t <cores>` (32 slots of 1024 tokens). Before measuring it prints the CPU's instruction
sets and its read bandwidth, and for each model the bandwidth ceiling of one stream
(bench/driver/hardware.py): the bandwidth over the bytes of weights each token reads.
C clients each stream chat completions (64 tokens, ignore_eos, greedy) back to back;
the two servers take turns at each concurrency, and each figure is the median of the
turns, since this machine's speed drifts by +-15% from one minute to the next. Prints
output tok/s and TTFT p50 of each, and ovtrio / llama-server. Without a built peer it
says so in one line and measures ovtrio alone. `--isa avx2` measures the AVX2 code of both
on a machine with AVX-512: llama-server built with `bench.build_llama_server --isa avx2`, and
ovtrio with OpenVINO's CPU plugin narrowed to AVX2.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from functools import partial
from pathlib import Path

import trio

from bench.build_llama_server import binary_path
from bench.driver import server
from bench.driver.hardware import ceiling_tok_s, describe_cpu, gguf_path, read_bandwidth_gb_s
from bench.driver.requests import load, stream_chat
from bench.driver.results import Outcome, streams
from bench.driver.server import free_port, served_model_id, wait_ready
from bench.driver.stats import medians
from bench.driver.turns import take_turns_async

# What `--isa avx2` sets for ovtrio: OpenVINO's CPU plugin needs both to keep to AVX2
# (docs/determinism.md).
NARROWED_TO_AVX2 = {"OV_CPU_MAX_ISA": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def start_ovtrio(gguf: Path, port: int, isa: str = "native") -> subprocess.Popen:
    flags = ["--model", str(gguf), "--log-level", "warning"]
    return server.start(flags, port=port, env=NARROWED_TO_AVX2 if isa == "avx2" else None).process


def start_llama_server(binary: Path, gguf: Path, port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [
            str(binary),
            "-m",
            str(gguf),
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "-np",
            "32",
            "-c",
            "32768",
            "-t",
            str(os.cpu_count() or 2),
            "--log-disable",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


Figures = dict[str, dict[int, dict[str, float]]]


async def measure(args: argparse.Namespace, gguf: Path) -> Figures:
    servers: dict[str, tuple[int, str]] = {}
    processes = []
    try:
        port = free_port()
        processes.append(start_ovtrio(gguf, port, args.isa))
        await wait_ready(port, processes[-1])
        model_id = await served_model_id(port)
        servers["ovtrio"] = (port, model_id)
        binary = binary_path(isa=args.isa)
        if binary.exists():
            port = free_port()
            processes.append(start_llama_server(binary, gguf, port))
            await wait_ready(port, processes[-1], b"/health")  # 503 while it loads
            servers["llama-server"] = (port, model_id)
        else:
            print(
                f"llama-server not built ({binary} missing; run python -m bench.build_llama_server --isa {args.isa}):"
                " measuring ovtrio alone"
            )
        figures: Figures = {name: {} for name in servers}
        for concurrency in args.concurrency:
            for port, model in servers.values():
                await stream_chat(port, model, "Hello!", 4)
                await load(port, model, concurrency, args.tokens, 1)  # warm the shapes
            parts = {
                name: partial(load, port, model, concurrency, args.tokens, args.rounds)
                for name, (port, model) in servers.items()
            }
            turns = await take_turns_async(parts, args.turns)
            for name, results in turns.items():
                figures[name][concurrency] = medians(results)
        return figures
    finally:
        for process in processes:
            server.stop(process, 30)


def print_table(args: argparse.Namespace, gguf: Path, figures: Figures, ceiling: float) -> None:
    ours = figures["ovtrio"]
    peer = figures.get("llama-server")
    print(
        f"\n{gguf.name}: {args.tokens} output tokens, ignore_eos, greedy, chat streaming, medians of {args.turns}"
        f" interleaved turns; one stream's bandwidth ceiling {ceiling:.0f} tok/s"
    )
    print(
        f"{'conc':>4} {'ovtrio tok/s':>12} {'llama tok/s':>11} {'ratio':>6} {'ovtrio TTFT':>11} {'llama TTFT':>10}"
        f" {'diff':>8} {'c=1 of ceiling (ovtrio, llama)':>31}"
    )
    for c in args.concurrency:
        o = ours[c]
        share = f"{o['tok_s'] / ceiling:.2f}" if c == 1 else ""
        if peer is None:
            print(
                f"{c:>4} {o['tok_s']:>12.1f} {'-':>11} {'-':>6} {o['ttft_p50']:>9.1f}ms {'-':>10} {'-':>8} {share:>31}"
            )
            continue
        p = peer[c]
        if c == 1:
            share = f"{o['tok_s'] / ceiling:.2f}, {p['tok_s'] / ceiling:.2f}"
        print(
            f"{c:>4} {o['tok_s']:>12.1f} {p['tok_s']:>11.1f} {o['tok_s'] / p['tok_s']:>6.2f}"
            f" {o['ttft_p50']:>9.1f}ms {p['ttft_p50']:>8.1f}ms {o['ttft_p50'] - p['ttft_p50']:>+6.1f}ms {share:>31}"
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", nargs="+", default=["embedded"], help="GGUF files to serve ('embedded': the embedded model)"
    )
    parser.add_argument(
        "--label",
        default="",
        help="what sets these models apart from the usual pair (e.g. 'GGUF types'): the tables keep the run"
        " in a column of its own and the chart and README leave it out",
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="requests each client sends per turn")
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument(
        "--isa",
        choices=["native", "avx2"],
        default="native",
        help="avx2: both servers keep to AVX2 (llama-server built with --isa avx2, OpenVINO narrowed)",
    )


def run(args: argparse.Namespace) -> Outcome:
    started = time.perf_counter()
    machine = describe_cpu() + ("; both servers narrowed to AVX2" if args.isa == "avx2" else "")
    bandwidth = read_bandwidth_gb_s()
    print(f"cpu: {machine}; read bandwidth {bandwidth:.1f} GB/s")
    results: dict[str, Figures] = {}
    summary: dict[str, float] = {"read bandwidth GB/s": bandwidth}
    for gguf in map(gguf_path, args.model):
        figures = trio.run(measure, args, gguf)
        ceiling = ceiling_tok_s(gguf, bandwidth)
        print_table(args, gguf, figures, ceiling)
        results[gguf.name] = figures
        summary[f"{gguf.name}: one stream's ceiling tok/s"] = ceiling
        for c in args.concurrency:
            ours, peer = figures["ovtrio"][c], figures.get("llama-server", {}).get(c)
            summary[f"{gguf.name}: ovtrio tok/s, {streams(c)}"] = ours["tok_s"]
            summary[f"{gguf.name}: ovtrio TTFT p50 ms, {streams(c)}"] = ours["ttft_p50"]
            if peer:
                summary[f"{gguf.name}: llama-server tok/s, {streams(c)}"] = peer["tok_s"]
                summary[f"{gguf.name}: llama-server TTFT p50 ms, {streams(c)}"] = peer["ttft_p50"]
                summary[f"{gguf.name}: ovtrio/llama-server, {streams(c)}"] = ours["tok_s"] / peer["tok_s"]
    elapsed = time.perf_counter() - started
    print(f"(ratio: ovtrio / llama-server output tok/s; diff: ovtrio TTFT p50 - llama-server's; {elapsed:.0f} s)")
    apart = ["both servers narrowed to AVX2"] if args.isa == "avx2" else []
    variant = "; ".join(apart + ([args.label] if args.label else []))
    return Outcome(summary, {"isa": args.isa, "machine": machine, "figures": results}, variant)
