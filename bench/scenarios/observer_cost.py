"""What recording request metrics costs the scheduler's loop per engine step.

Each step, Delivery.deliver() makes one observer call per choice that got tokens
(`first_token` or `inter_token`) and one at each choice's end. This times those calls
for a step of N streams in decode (the common case: one `inter_token` each), through
ovtrio.serving.metrics.ModelMetrics (prometheus_client histograms) and through NoObserver (the
cost of the calls alone), without the engine.

    python -m bench observer_cost [--streams 16 64 256]
"""

from __future__ import annotations

import argparse
import time

from bench.driver.results import Outcome
from ovtrio.scheduler import NoObserver
from ovtrio.serving.metrics import ServerMetrics


def per_step(observer, streams: int, steps: int = 2000) -> float:
    """Seconds per step for `streams` choices each getting a token."""
    last = [0.0] * streams
    started = time.perf_counter()
    for step in range(steps):
        now = step * 0.02
        for i in range(streams):
            observer.inter_token(now - last[i])
            last[i] = now
    return (time.perf_counter() - started) / steps


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--streams", type=int, nargs="+", default=[16, 64, 256], help="choices in one step")


def run(args: argparse.Namespace) -> Outcome:
    metrics = ServerMetrics().for_model("bench", 8192)
    summary = {}
    for streams in args.streams:
        recorded = per_step(metrics, streams)
        bare = per_step(NoObserver(), streams)
        print(
            f"{streams:4d} streams: {recorded * 1e3:.3f} ms a step with histograms "
            f"({recorded / streams * 1e6:.2f} us a stream), {bare * 1e3:.3f} ms with no observer"
        )
        summary[f"{streams} streams: us per stream and step, histograms"] = recorded / streams * 1e6
        summary[f"{streams} streams: us per stream and step, no observer"] = bare / streams * 1e6
    return Outcome(summary)
