"""Percentiles, computed one way for every scenario so figures stay comparable."""

from __future__ import annotations

import statistics
from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float:
    """The nearest-rank `q`th percentile (0-100) of `values`: a value that was measured,
    never an interpolation; nan when there are none."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def median(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def medians(turns: list[dict[str, float]]) -> dict[str, float]:
    """Each key's median over the turns (dicts with the same keys)."""
    return {key: statistics.median(turn[key] for turn in turns) for key in turns[0]}
