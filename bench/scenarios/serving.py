"""The server against the raw engine: the same prompts and settings, in turns.

    python -m bench serving [--concurrency 1 4 16 32] [--tokens 64] [--rounds 2] [--turns 5]

1. Raw engine: ContinuousBatchingPipeline.generate() on C chat prompts at once (no
   HTTP), 64 new tokens, ignore_eos, greedy -> output tok/s. Its TTFT is the first
   engine step of a lone request (the prefill).
2. Server: `ovtrio serve` as a subprocess, C concurrent streaming chat requests,
   each client sending `rounds` requests back to back, the same prompts and settings
   -> output tok/s (from usage), TTFT and inter-token latency p50/p99, and the ratio
   server/engine.
Also: idle RSS of the server, its idle CPU, and the time from process start to the
first streamed token.
"""

from __future__ import annotations

import argparse
import os
import time

import trio

from bench.driver.engine import RawEngine
from bench.driver.hardware import gguf_path
from bench.driver.requests import load, stream_chat
from bench.driver.results import Outcome, streams
from bench.driver.server import Server, cpu_seconds, metric, rss_mb, served_model_id, serving
from bench.driver.stats import medians


async def server_figures(
    args: argparse.Namespace, server: Server, engine: RawEngine
) -> tuple[dict[int, dict[str, float]], dict[str, float], dict[int, list[dict[str, float]]]]:
    port = server.port
    model = await served_model_id(port)
    sent = time.perf_counter()
    first = await stream_chat(port, model, "Hello!", 4)
    start_to_first_token = sent + first.ttft - server.launched
    await trio.sleep(2)
    misc = {"start_to_first_token_s": start_to_first_token, "idle_rss_mb": rss_mb(server.pid)}
    figures = {}
    samples = {}
    for concurrency in args.concurrency:
        await load(port, model, concurrency, args.tokens, 1)  # warm the shapes
        # This machine's speed drifts by +-15% from one second to the next, so the
        # engine and the server take turns, and the figures are medians of the turns.
        turns = []
        for _ in range(args.turns):
            engine_tok_s = engine.throughput(concurrency)
            step_seconds = await metric(port, "ovtrio_engine_step_seconds_total")
            started = time.perf_counter()
            turn = await load(port, model, concurrency, args.tokens, args.rounds)
            busy = await metric(port, "ovtrio_engine_step_seconds_total") - step_seconds
            turn["engine_busy"] = busy / (time.perf_counter() - started)
            turn["engine_tok_s"] = engine_tok_s
            turn["ratio"] = turn["tok_s"] / engine_tok_s
            turns.append(turn)
        figures[concurrency] = medians(turns)
        samples[concurrency] = turns
    misc["engine_ttft_ms"] = engine.ttft_ms()
    idle_cpu_start = cpu_seconds(server.pid)
    await trio.sleep(3)
    misc["idle_cpu_percent"] = (cpu_seconds(server.pid) - idle_cpu_start) / 3 * 100
    return figures, misc, samples


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="embedded", help="a GGUF file ('embedded': the embedded model)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="requests each client sends per turn")
    parser.add_argument("--turns", type=int, default=5, help="engine/server turns per concurrency")
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="extra `ovtrio serve` flag (repeat), e.g. --server-arg=--no-gil-free-step",
    )


def run(args: argparse.Namespace) -> Outcome:
    if 1 not in args.concurrency:
        args.concurrency = [1, *args.concurrency]
    model_path = gguf_path(args.model)
    engine = RawEngine(str(model_path), args.tokens)
    with serving(["--model", str(model_path), "--log-level", "warning", *args.server_arg]) as started:
        server, misc, samples = trio.run(server_figures, args, started, engine)
    print(
        f"ovtrio serving benchmark: {model_path.name}, CPU, {os.cpu_count()} cores,"
        f" {args.tokens} output tokens, ignore_eos, greedy, chat streaming"
    )
    header = (
        f"{'conc':>4} {'engine tok/s':>12} {'server tok/s':>12} {'ratio':>6} {'TTFT p50':>9} {'TTFT p99':>9}"
        f" {'ITL p50':>8} {'ITL p99':>8} {'TPOT':>7} {'in step':>7}"
    )
    print(header)
    for c in args.concurrency:
        s = server[c]
        print(
            f"{c:>4} {s['engine_tok_s']:>12.1f} {s['tok_s']:>12.1f} {s['ratio']:>6.2f}"
            f" {s['ttft_p50']:>7.1f}ms {s['ttft_p99']:>7.1f}ms {s['itl_p50']:>6.1f}ms {s['itl_p99']:>6.1f}ms"
            f" {s['tpot_p50']:>5.1f}ms {s['engine_busy']:>6.0%}"
        )
    print(
        "(ITL: gap between streamed chunks; TPOT: time per output token after the first;"
        " in step: share of the server's wall time spent inside the engine's step())"
    )
    if args.server_arg:
        print(f"server flags: {' '.join(args.server_arg)}")
    print(f"engine TTFT (prefill step of a lone request): {misc['engine_ttft_ms']:.1f} ms")
    print(
        f"server idle RSS: {misc['idle_rss_mb']:.0f} MB; idle CPU: {misc['idle_cpu_percent']:.1f}%;"
        f" process start to first token: {misc['start_to_first_token_s']:.2f} s"
    )
    summary: dict[str, float] = {}
    for c in args.concurrency:
        figures = server[c]
        summary[f"engine tok/s, {streams(c)}"] = figures["engine_tok_s"]
        summary[f"server tok/s, {streams(c)}"] = figures["tok_s"]
        summary[f"server/engine, {streams(c)}"] = figures["ratio"]
        summary[f"TTFT p50 ms, {streams(c)}"] = figures["ttft_p50"]
        summary[f"ITL p99 ms, {streams(c)}"] = figures["itl_p99"]
        summary[f"in step, {streams(c)}"] = figures["engine_busy"]
    summary["engine TTFT ms"] = misc["engine_ttft_ms"]
    summary["idle RSS MB"] = misc["idle_rss_mb"]
    summary["idle CPU %"] = misc["idle_cpu_percent"]
    summary["start to first token s"] = misc["start_to_first_token_s"]
    variant = "" if args.model == "embedded" else model_path.name
    return Outcome(summary, {"turns": samples, "medians": server, "misc": misc}, variant)
