"""Turning generated token ids into text, incrementally, and cutting it at stop strings.

With a byte-level vocabulary table (ovtrio/text/vocabulary.py) each token's bytes go through
an incremental UTF-8 decoder: exact and nearly free. Otherwise the engine's detokenizer
is used, as follows. Detokenizing one token at a time is wrong for most tokenizers: a character may span
several tokens (UTF-8 pieces), and SentencePiece-style tokenizers drop the leading
space of the first token decoded. So each sequence decodes a short window that starts a
few tokens back ("prefix") and emits only what the window adds beyond the prefix, once
it no longer ends in a partial character. The windows of every sequence in a step are
decoded in one batched tokenizer call.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Sequence
from typing import Any

# Prompt tokens kept as context for the first generated token's window.
_CONTEXT_TOKENS = 5
_REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Per-sequence state of the windowed decode described in the module docstring."""

    __slots__ = ("_ids", "_prefix_offset", "_read_offset", "skip_special_tokens")

    def __init__(self, prompt_ids: Sequence[int], skip_special_tokens: bool = True) -> None:
        self._ids: list[int] = list(prompt_ids[-_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self.skip_special_tokens = skip_special_tokens

    def append(self, token_ids: Iterable[int]) -> None:
        self._ids.extend(token_ids)

    def windows(self) -> tuple[list[int], list[int]]:
        """The (prefix, prefix + unread) id windows to decode."""
        return self._ids[self._prefix_offset : self._read_offset], self._ids[self._prefix_offset :]

    def advance(self, prefix_text: str, full_text: str) -> str:
        """Given the decoded windows, return the new text and move the window forward."""
        if len(full_text) <= len(prefix_text) or full_text.endswith(_REPLACEMENT_CHAR):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        # Keep the id list short: only the window is ever decoded again.
        if self._prefix_offset > 64:
            del self._ids[: self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0
        return full_text[len(prefix_text) :]


class VocabularyDetokenizer:
    """Detokenizes from a table of token bytes; see the module docstring."""

    __slots__ = ("_table", "_skipped", "_utf8", "_pending")

    def __init__(
        self,
        token_bytes: list[bytes],
        special_ids: frozenset[int],
        skip_special_tokens: bool = True,
        keep: frozenset[int] = frozenset(),
    ) -> None:
        self._table = token_bytes
        self._skipped = special_ids - keep if skip_special_tokens else frozenset()
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""

    def append(self, token_ids: Iterable[int]) -> None:
        table, skipped = self._table, self._skipped
        data = b"".join(table[i] for i in token_ids if i not in skipped)
        self._pending += self._utf8.decode(data)

    def take(self) -> str:
        text, self._pending = self._pending, ""
        return text


Detokenizer = IncrementalDetokenizer | VocabularyDetokenizer


def decode_batch(decoder: Any, detokenizers: Sequence[Detokenizer]) -> list[str]:
    """New text of every detokenizer; the engine-backed ones share one batched decode
    call per skip_special_tokens setting."""
    results = [""] * len(detokenizers)
    for i, detokenizer in enumerate(detokenizers):
        if isinstance(detokenizer, VocabularyDetokenizer):
            results[i] = detokenizer.take()
    for skip in (True, False):
        chosen = [
            (i, d)
            for i, d in enumerate(detokenizers)
            if isinstance(d, IncrementalDetokenizer) and d.skip_special_tokens is skip
        ]
        if not chosen:
            continue
        batch: list[list[int]] = []
        for _, detokenizer in chosen:
            prefix, full = detokenizer.windows()
            batch.append(prefix)
            batch.append(full)
        texts = _decode(decoder, batch, skip)
        for n, (i, detokenizer) in enumerate(chosen):
            results[i] = detokenizer.advance(texts[2 * n], texts[2 * n + 1])
    return results


def _decode(decoder: Any, batch: list[list[int]], skip_special_tokens: bool) -> list[str]:
    # Empty windows decode to "" without a tokenizer call (the batch decoder wants
    # at least one id per row).
    wanted = [row for row in batch if row]
    decoded = iter(decoder.decode(wanted, skip_special_tokens=skip_special_tokens) if wanted else [])
    return [next(decoded) if row else "" for row in batch]


class StopMatcher:
    """Finds the first stop string in streamed text, holding back just enough text that a
    stop string split across deltas is still caught before any of it is emitted."""

    __slots__ = ("_stops", "_include", "_hold", "_pending")

    def __init__(self, stops: Sequence[str], include_stop: bool) -> None:
        self._stops = tuple(s for s in stops if s)
        self._include = include_stop
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._pending = ""

    def feed(self, text: str) -> tuple[str, str | None]:
        """Add `text`; return (text safe to emit now, the stop string that matched or None).

        After a match, the emitted text ends just before the stop string (or just after
        it, when stop strings are included) and everything after it is dropped.
        """
        if not self._stops:
            return text, None
        buffer = self._pending + text
        best = -1
        best_stop = ""
        for stop in self._stops:
            at = buffer.find(stop)
            if at != -1 and (best == -1 or at < best):
                best, best_stop = at, stop
        if best != -1:
            self._pending = ""
            return buffer[: best + (len(best_stop) if self._include else 0)], best_stop
        if self._hold == 0:
            self._pending = ""
            return buffer, None
        self._pending = buffer[-self._hold :]
        return buffer[: -self._hold], None

    def flush(self) -> str:
        """Text still held back when the sequence ends without a match."""
        pending, self._pending = self._pending, ""
        return pending
