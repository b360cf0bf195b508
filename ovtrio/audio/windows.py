"""How one 30 s window's output joins the next: which of the pipeline's segments and
words a window keeps, and where the next window starts.

WhisperPipeline (openvino-genai 2026.4) walks the audio it is given in passes of 30 s
itself. A pass that ends inside a segment (text after the last timestamp pair: someone
speaks on past the window) drops that unfinished segment and the pipeline starts its next
pass at the end of the last complete segment, as OpenAI's Whisper moves its `seek`. Given
one window, that next pass hears the window's last seconds and then nothing: it reports
the sentence the window cut as a segment of its own, which may end past the window, and
the next window would write it again. Here a window keeps what its first pass made and
the next window starts where the pipeline's would have, at the end of the first pass's
last complete segment: a sentence the window cut is written once, whole, by the next
window. Segments and words come out in order and never overlap.

Which segments come from the first pass: the pipeline tells its streamer each pass's text
tokens once the pass is done (ovtrio/audio/engine.py counts them, and stops the pipeline
at the second pass); the first pass's segments are those whose texts make its text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

# A window whose first pass ends inside a segment that starts (or, for the segment before
# it, ends) before this is not cut there: the next window would cover mostly the same
# audio again, and a model that never closes a segment would take a window a second.
LEAST_ADVANCE_SECONDS = 5.0


class ChunkRecord(Protocol):
    """A segment as the pipeline reports it (WhisperDecodedResultChunk): seconds from the
    window's start; `end_ts` is -1 for a lone segment without an end timestamp."""

    @property
    def start_ts(self) -> float: ...
    @property
    def end_ts(self) -> float: ...
    @property
    def text(self) -> str: ...


class WordRecord(Protocol):
    """A word as the pipeline reports it (WhisperWordTiming)."""

    @property
    def word(self) -> str: ...
    @property
    def start_ts(self) -> float: ...
    @property
    def end_ts(self) -> float: ...
    @property
    def token_ids(self) -> Sequence[int]: ...


@dataclass(frozen=True)
class WindowOutput:
    """What the pipeline reported for one window."""

    chunks: Sequence[ChunkRecord]
    words: Sequence[WordRecord]
    first_text: str  # the text of its first pass's complete segments (its streamer's first write)
    first_tokens: int  # how many text tokens that was
    went_on: bool  # it started a second pass: the first ended inside a segment


@dataclass(frozen=True)
class Timed:
    """A segment or word: seconds from the window's start."""

    start: float
    end: float
    text: str


@dataclass(frozen=True)
class Kept:
    segments: list[Timed]
    words: list[Timed]
    advance: float  # seconds from this window's start to the next window's start
    whole: bool  # every segment the pipeline reported was kept as it was


def stitch(output: WindowOutput, seconds: float, full: bool) -> Kept:
    """What a window of `seconds` of audio keeps of `output`, and where the next starts.
    `full`: more audio follows the window (it is not the audio's last)."""
    chunks = list(output.chunks)
    first = first_pass_count([chunk.text for chunk in chunks], output.first_text) if output.went_on else len(chunks)
    if full and output.went_on and first and chunks[first - 1].end_ts >= LEAST_ADVANCE_SECONDS:
        # The first pass ended inside a segment: the next window starts where it did.
        advance = chunks[first - 1].end_ts
        words = _first_words(output.words, output.first_tokens)
        return Kept(_timed(chunks[:first], advance), _words(words, advance), advance, whole=False)
    if full and chunks and chunks[-1].end_ts < 0 and chunks[-1].start_ts >= LEAST_ADVANCE_SECONDS:
        # One segment with no end at all: the next window starts at it.
        advance = chunks[-1].start_ts
        return Kept(_timed(chunks[:-1], advance), _words(output.words, advance), advance, whole=False)
    # The window's own end: what the pipeline reported past it (a model's timestamps run
    # to 30 s after where its pass started) is cut there.
    segments = _timed(chunks, seconds)
    whole = len(segments) == len(chunks) and all(
        (s.start, s.end) == (c.start_ts, c.end_ts) for s, c in zip(segments, chunks, strict=False)
    )
    return Kept(segments, _words(output.words, seconds), seconds, whole)


def first_pass_count(texts: Sequence[str], first_text: str) -> int:
    """How many of the segments' `texts` the first pass wrote: the fewest whose joined
    text is `first_text`; failing that (a character split across two segments decodes
    otherwise alone), the count whose joined length comes nearest."""
    joined = ""
    best, best_gap = 0, len(first_text)
    for count, text in enumerate(texts, start=1):
        joined += text
        if joined == first_text:
            return count
        gap = abs(len(joined) - len(first_text))
        if gap < best_gap:
            best, best_gap = count, gap
    return best


def _first_words(words: Sequence[WordRecord], tokens: int) -> list[WordRecord]:
    """The words of the first pass's complete segments: the pipeline times every word
    its pass wrote, those of the unfinished segment it dropped too, in order."""
    kept: list[WordRecord] = []
    counted = 0
    for word in words:
        counted += len(word.token_ids)
        if counted > tokens:
            break
        kept.append(word)
    return kept


def _timed(chunks: Sequence[ChunkRecord], limit: float) -> list[Timed]:
    """The chunks as segments within [0, limit], each starting where the one before
    ended at the earliest."""
    segments: list[Timed] = []
    floor = 0.0
    for chunk in chunks:
        start = max(chunk.start_ts, floor)
        if start >= limit:
            break
        end = limit if chunk.end_ts < 0 else min(max(chunk.end_ts, start), limit)
        segments.append(Timed(start, end, chunk.text))
        floor = end
    return segments


def _words(words: Sequence[WordRecord], limit: float) -> list[Timed]:
    return in_order([Timed(word.start_ts, word.end_ts, word.word) for word in words], limit)


def in_order(items: Sequence[Timed], limit: float) -> list[Timed]:
    """The `items` that start before `limit`, each starting where the one before ended at
    the earliest, within [0, limit]."""
    timed: list[Timed] = []
    floor = 0.0
    for item in items:
        start = max(item.start, floor)
        if start >= limit:
            break
        end = min(max(item.end, start), limit)
        timed.append(Timed(start, end, item.text))
        floor = end
    return timed
