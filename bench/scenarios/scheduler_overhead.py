"""The scheduler's own cost, without HTTP: the raw engine against the scheduler driving it.

The raw engine against ovtrio's scheduler driving the same engine, in one process run.

    python -m bench scheduler_overhead [--concurrency 1 4 16] [--turns 5]

At each concurrency C, in interleaved turns (this machine's speed drifts by up to 15%,
so the figures are medians of the turns):

1. the raw engine: ContinuousBatchingPipeline.generate() on C chat prompts at once,
   64 new tokens, ignore_eos, greedy (the serving scenario's prompts and settings);
2. the scheduler as the server runs it (GIL-free steps, runs of steps: its worker thread
   steps on by itself while the loop has nothing to do between steps), C consumers that
   each submit two such requests back to back and drain their channels;
3. the same scheduler handing every step back to its loop (`step_runs=False`, the
   stepping before runs).

Reported: output tok/s of each and its ratio to the engine's, the share of the
scheduler's wall time inside the engine's step, the mean time between two steps, and
the CPU time of the loop's thread (the event loop) per token. The figures isolate what
the scheduler adds between and beside the steps; the serving scenario measures the whole
server, HTTP included.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import trio

from bench.driver.engine import RawEngine
from bench.driver.requests import prompts
from bench.driver.results import Outcome, streams

TOKENS = 64
ROUNDS = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--turns", type=int, default=5)


def run(args: argparse.Namespace) -> Outcome:
    from ovtrio.loading.load import load_model
    from ovtrio.model.source import resolve_model
    from ovtrio.scheduler import GenerationRequest, SamplingParams, Scheduler
    from ovtrio.scheduler.engine_step import gil_free_step
    from ovtrio.settings.server import Settings

    # The server's own pipeline (from the model cache, with its settings), measured alone
    # by the driver's RawEngine and driven by the scheduler, in turns.
    settings = Settings()
    model = load_model(resolve_model(settings), settings)
    pipeline, tokenizer = model.pipeline, model.tokenizer
    engine = RawEngine(str(model.source.path), TOKENS, pipeline)

    def chat_ids(text: str) -> list[int]:
        return [int(i) for i in engine.chat_ids(text).data[0]]

    step = gil_free_step(pipeline)
    if not step.releases_gil:
        sys.exit("the GIL-free step is not available here: runs of steps need it")

    async def scheduler_turn(scheduler: Scheduler, concurrency: int) -> dict[str, float]:
        texts = [chat_ids(p) for p in prompts(concurrency)]
        tokens = 0

        async def client(index: int) -> None:
            nonlocal tokens
            for _ in range(ROUNDS):
                generation = GenerationRequest(
                    [texts[index]], SamplingParams(max_new_tokens=TOKENS, temperature=0.0, ignore_eos=True)
                )
                async with scheduler.submit(generation) as stream:
                    while messages := await stream.receive_available():
                        tokens += sum(len(getattr(m, "token_ids", ())) for m in messages)

        before, cpu_before, started = scheduler.stats(), time.thread_time(), time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(concurrency):
                nursery.start_soon(client, i)
        wall, cpu = time.perf_counter() - started, time.thread_time() - cpu_before
        after = scheduler.stats()
        in_step = after.step_seconds - before.step_seconds
        steps = max(1, after.steps - before.steps)
        return {
            "tok_s": tokens / wall,
            "in_step": in_step / wall,
            "gap_ms": (wall - in_step) / steps * 1e3,
            "loop_cpu_us": cpu / max(1, tokens) * 1e6,
        }

    async def quiet(scheduler: Scheduler) -> None:
        # generate() refuses to start while the loop's last (empty) step may still run.
        while scheduler.stats().step_in_flight or scheduler.in_flight:
            await trio.sleep(0.01)
        await trio.sleep(0.05)

    async def measure() -> dict[int, dict[str, dict[str, float]]]:
        figures: dict[int, dict[str, dict[str, float]]] = {}
        async with trio.open_nursery() as nursery:
            schedulers = {
                "runs": Scheduler(pipeline, tokenizer, model.vocabulary, step=step),
                "one step": Scheduler(pipeline, tokenizer, model.vocabulary, step=step, step_runs=False),
            }
            for concurrency in args.concurrency:
                turns: dict[str, list[dict[str, float]]] = {"engine": [], **{name: [] for name in schedulers}}
                for turn in range(args.turns):
                    turns["engine"].append({"tok_s": await trio.to_thread.run_sync(engine.throughput, concurrency)})
                    order = list(schedulers.items())
                    for name, scheduler in order if turn % 2 == 0 else order[::-1]:
                        # One scheduler owns the engine at a time: each runs only for its turn.
                        scope = trio.CancelScope()
                        await nursery.start(_serve, scheduler, scope)
                        await quiet(scheduler)
                        turns[name].append(await scheduler_turn(scheduler, concurrency))
                        await quiet(scheduler)
                        scope.cancel()
                        await trio.sleep(0.05)
                figures[concurrency] = {
                    name: {key: statistics.median(t[key] for t in results) for key in results[0]}
                    for name, results in turns.items()
                }
                print(f"  concurrency {concurrency}: done", file=sys.stderr, flush=True)
        return figures

    figures = trio.run(measure)
    print(
        f"ovtrio scheduler overhead (no HTTP): {Path(str(model.source.path)).name}, CPU, {os.cpu_count()} cores,"
        f" {TOKENS} output tokens, ignore_eos, greedy, {ROUNDS} requests per consumer"
    )
    print(
        f"{'conc':>4} {'engine tok/s':>12}  {'stepping':<8} {'tok/s':>7} {'ratio':>6} {'in step':>7}"
        f" {'gap/step':>9} {'loop CPU/token':>14}"
    )
    for concurrency, by_name in figures.items():
        engine = by_name["engine"]["tok_s"]
        for name in ("runs", "one step"):
            f = by_name[name]
            print(
                f"{concurrency:>4} {engine:>12.1f}  {name:<8} {f['tok_s']:>7.1f} {f['tok_s'] / engine:>6.2f}"
                f" {f['in_step']:>7.0%} {f['gap_ms']:>7.2f}ms {f['loop_cpu_us']:>12.0f}us"
            )
    print(
        "(runs: the worker steps on by itself between hand-offs, as the server does; one step: every step"
        " handed back to the loop; gap/step: wall time outside the engine's step per step)"
    )
    summary: dict[str, float] = {}
    for concurrency, by_name in figures.items():
        engine = by_name["engine"]["tok_s"]
        for name in ("runs", "one step"):
            summary[f"{name}: scheduler/engine, {streams(concurrency)}"] = by_name[name]["tok_s"] / engine
            summary[f"{name}: gap per step ms, {streams(concurrency)}"] = by_name[name]["gap_ms"]
    return Outcome(summary, figures)


async def _serve(scheduler, scope: trio.CancelScope, task_status=trio.TASK_STATUS_IGNORED) -> None:
    with scope:
        await scheduler.run(task_status=task_status)
