"""ovtrio against llama.cpp's llama-server: the same GGUF, the same workload, interleaved.

    python bench/build_llama_server.py     # once: builds the peer (5-10 min on 2 cores)
    python bench/peer.py [--concurrency 1 4 16 32] [--tokens 64] [--turns 5]

Both servers run the embedded SmolLM2-135M-Instruct Q4_1 GGUF on the CPU: `ovtrio serve`
with its defaults, `llama-server -np 32 -c 32768 -t <cores>` (32 slots of 1024 tokens).
C clients each stream chat completions (64 tokens, ignore_eos, greedy) back to back;
the two servers take turns at each concurrency, and each figure is the median of the
turns, since this machine's speed drifts by +-15% from one minute to the next. Prints
output tok/s and TTFT p50 of each, and ovtrio / llama-server. Without a built peer it
says so in one line and measures ovtrio alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import trio

from build_llama_server import binary_path
from serving import free_port, load, stream_chat, wait_ready


def start_ovtrio(port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "ovtrio", "serve", "--port", str(port), "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def start_llama_server(binary: Path, gguf: Path, port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [
            str(binary), "-m", str(gguf), "--port", str(port), "--host", "127.0.0.1",
            "-np", "32", "-c", "32768", "-t", str(os.cpu_count() or 2), "--log-disable",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def measure(args: argparse.Namespace) -> dict[str, dict[int, dict[str, float]]]:
    from ovtrio.model import EMBEDDED_NAME, embedded_model_path

    servers: dict[str, tuple[int, str]] = {}
    processes = []
    try:
        port = free_port()
        processes.append(start_ovtrio(port))
        await wait_ready(port, processes[-1])
        servers["ovtrio"] = (port, EMBEDDED_NAME)
        binary = binary_path()
        if binary.exists():
            port = free_port()
            processes.append(start_llama_server(binary, embedded_model_path(), port))
            await wait_ready(port, processes[-1], b"/health")  # 503 while it loads
            servers["llama-server"] = (port, EMBEDDED_NAME)
        else:
            print(f"llama-server not built ({binary} missing; run bench/build_llama_server.py): measuring ovtrio alone")
        figures: dict[str, dict[int, dict[str, float]]] = {name: {} for name in servers}
        for concurrency in args.concurrency:
            for port, model in servers.values():
                await stream_chat(port, model, "Hello!", 4)
                await load(port, model, concurrency, args.tokens, 1)  # warm the shapes
            turns: dict[str, list[dict[str, float]]] = {name: [] for name in servers}
            for turn in range(args.turns):
                order = list(servers.items())
                if turn % 2:
                    order.reverse()
                for name, (port, model) in order:
                    turns[name].append(await load(port, model, concurrency, args.tokens, args.rounds))
            for name, results in turns.items():
                figures[name][concurrency] = {key: statistics.median(r[key] for r in results) for key in results[0]}
        return figures
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="requests each client sends per turn")
    parser.add_argument("--turns", type=int, default=5)
    args = parser.parse_args()
    started = time.perf_counter()
    figures = trio.run(measure, args)
    ours = figures["ovtrio"]
    peer = figures.get("llama-server")
    print(
        f"ovtrio vs llama-server: SmolLM2-135M-Instruct Q4_1 GGUF, CPU, {os.cpu_count()} cores, {args.tokens} output"
        f" tokens, ignore_eos, greedy, chat streaming, medians of {args.turns} interleaved turns"
    )
    print(
        f"{'conc':>4} {'ovtrio tok/s':>12} {'llama tok/s':>11} {'ratio':>6}"
        f" {'ovtrio TTFT':>11} {'llama TTFT':>10} {'diff':>8}"
    )
    for c in args.concurrency:
        o = ours[c]
        if peer is None:
            print(f"{c:>4} {o['tok_s']:>12.1f} {'-':>11} {'-':>6} {o['ttft_p50']:>9.1f}ms {'-':>10} {'-':>8}")
            continue
        p = peer[c]
        print(
            f"{c:>4} {o['tok_s']:>12.1f} {p['tok_s']:>11.1f} {o['tok_s'] / p['tok_s']:>6.2f}"
            f" {o['ttft_p50']:>9.1f}ms {p['ttft_p50']:>8.1f}ms {o['ttft_p50'] - p['ttft_p50']:>+6.1f}ms"
        )
    print(
        "(ratio: ovtrio / llama-server output tok/s; diff: ovtrio TTFT p50 - llama-server's;"
        f" {time.perf_counter() - started:.0f} s)"
    )


if __name__ == "__main__":
    main()
