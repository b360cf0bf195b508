"""Speech made faster or slower without changing its pitch: FFmpeg's `atempo` filter
(through PyAV), which time-stretches by 0.5 to 2 at a time (a chain of them for 0.25 to
4, OpenAI's range of `speed`).

Each piece (a sentence) is stretched on its own, its filter drained at its end: the
filter keeps back most of a second of what it was given until more comes, which would
hold a sentence's audio until the next was spoken. Pieces end at sentence ends, where
the voice pauses anyway. Runs in a worker thread (milliseconds a second of audio).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np


def factors(speed: float) -> list[float]:
    """atempo factors, each in [0.5, 2], whose product is `speed`."""
    chain: list[float] = []
    while speed > 2.0:
        chain.append(2.0)
        speed /= 2.0
    while speed < 0.5:
        chain.append(0.5)
        speed /= 0.5
    return [*chain, speed]


def stretched(samples: np.ndarray, sample_rate: int, speed: float) -> np.ndarray:
    """`samples` (float32 mono) played `speed` times as fast, about len / speed of them."""
    if speed == 1.0 or not len(samples):
        return samples
    import av
    import av.filter

    graph = av.filter.Graph()
    source = graph.add_abuffer(format="flt", sample_rate=sample_rate, layout="mono", time_base=Fraction(1, sample_rate))
    last = source
    for factor in factors(speed):
        node = graph.add("atempo", f"{factor:.6f}")
        last.link_to(node)
        last = node
    sink = graph.add("abuffersink")
    last.link_to(sink)
    graph.configure()
    frame = av.AudioFrame.from_ndarray(
        np.ascontiguousarray(samples, dtype=np.float32).reshape(1, -1), format="flt", layout="mono"
    )
    frame.sample_rate = sample_rate
    frame.pts = 0
    source.push(frame)
    source.push(None)
    out: list[np.ndarray] = []
    while True:
        try:
            pulled: Any = sink.pull()
        except (av.error.BlockingIOError, av.error.EOFError):
            break
        out.append(pulled.to_ndarray().reshape(-1).astype(np.float32, copy=False))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)
