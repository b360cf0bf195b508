"""A text split into the pieces a text-to-speech model speaks one at a time: its
sentences, each at most MAX_PIECE_CHARACTERS long.

A sentence ends at `.`, `!`, `?` or `…` followed by space, at their full-width forms,
or at a line break. A sentence longer than the bound (a list without full stops) is cut
at its last comma, semicolon or colon before the bound, else at its last space, else at
the bound: SpeechT5 reads at most 600 positions, one per character.
"""

from __future__ import annotations

import re

MAX_PIECE_CHARACTERS = 300

# . ! ? and the ellipsis before a space; the full-width ideographic stop, ! and ? with or
# without one; a line break.
_SENTENCE_END = re.compile("(?<=[.!?\u2026])\\s+|(?<=[\u3002\uff01\uff1f])\\s*|\n+")
_CLAUSE_END = re.compile("[,;:\uff0c\uff1b\uff1a]\\s")  # , ; : and the full-width ones


def pieces(text: str, limit: int = MAX_PIECE_CHARACTERS) -> list[str]:
    """The pieces of `text`, in order, none empty nor over `limit` characters; joined
    with spaces they hold every word of `text`."""
    found: list[str] = []
    for sentence in _SENTENCE_END.split(text):
        sentence = " ".join(sentence.split())
        while len(sentence) > limit:
            head = sentence[: limit + 1]
            clause = [match.end() for match in _CLAUSE_END.finditer(head)]
            cut = clause[-1] if clause else head.rfind(" ") + 1 or limit
            found.append(sentence[:cut].strip())
            sentence = sentence[cut:].strip()
        if sentence:
            found.append(sentence)
    return [piece for piece in found if piece]
