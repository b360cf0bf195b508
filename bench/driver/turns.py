"""Interleaved turns: the machines these run on drift by up to 15% from one second to the
next, so what is compared takes turns, each part once a turn, and the figures are medians
of the turns (stats.medians)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def order(names: list[str], turn: int, alternate: bool) -> list[str]:
    """The parts' order in `turn`: as given, or reversed every other turn so that no part
    always runs right after the same one."""
    return names[::-1] if alternate and turn % 2 else names


def take_turns(parts: dict[str, Callable[[], T]], turns: int, alternate: bool = True) -> dict[str, list[T]]:
    """Each part's result of each turn."""
    results: dict[str, list[T]] = {name: [] for name in parts}
    for turn in range(turns):
        for name in order(list(parts), turn, alternate):
            results[name].append(parts[name]())
    return results


async def take_turns_async(
    parts: dict[str, Callable[[], Awaitable[T]]], turns: int, alternate: bool = True
) -> dict[str, list[T]]:
    """take_turns() for parts that are coroutines."""
    results: dict[str, list[T]] = {name: [] for name in parts}
    for turn in range(turns):
        for name in order(list(parts), turn, alternate):
            results[name].append(await parts[name]())
    return results
