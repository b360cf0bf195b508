"""What recording request metrics costs the scheduler's loop per engine step.

Each step, Delivery.deliver() makes one observer call per choice that got tokens
(`first_token` or `inter_token`) and one at each choice's end. This times those calls
for a step of N streams in decode (the common case: one `inter_token` each), through
ovtrio.serving.metrics.ModelMetrics (prometheus_client histograms) and through NoObserver (the
cost of the calls alone), without the engine.

    python -m bench.observer_cost [streams ...]   (from the repository root)
"""

from __future__ import annotations

import sys
import time

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


def main() -> None:
    counts = [int(arg) for arg in sys.argv[1:]] or [16, 64, 256]
    metrics = ServerMetrics().for_model("bench", 8192)
    for streams in counts:
        recorded = per_step(metrics, streams)
        bare = per_step(NoObserver(), streams)
        print(
            f"{streams:4d} streams: {recorded * 1e3:.3f} ms a step with histograms "
            f"({recorded / streams * 1e6:.2f} us a stream), {bare * 1e3:.3f} ms with no observer"
        )


if __name__ == "__main__":
    main()
