"""Ways to cut a text into pieces, for checking that incremental parsers give the same
result however their input is split."""

from __future__ import annotations

import random


def random_pieces(text: str, rng: random.Random) -> list[str]:
    """Text cut at random places, with piece sizes from single characters upward."""
    largest = rng.choice([1, 2, 3, 5, 8, 13, 40])
    pieces, pos = [], 0
    while pos < len(text):
        size = rng.randint(1, largest)
        pieces.append(text[pos : pos + size])
        pos += size
    return pieces


def splittings(text: str) -> list[list[str]]:
    """Every single character; every two-piece split; 60 random splittings (fixed seeds)."""
    result = [list(text)]
    result += [[text[:cut], text[cut:]] for cut in range(1, len(text))]
    result += [random_pieces(text, random.Random(seed)) for seed in range(60)]
    return result
