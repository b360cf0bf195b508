"""Bounds on word timings, as OpenAI's Whisper sets them (`add_word_timestamps` in its
whisper/timing.py).

The pipeline times words by aligning the text with the audio through the decoder's
cross-attention (dynamic time warping): a word after a pause gets the pause as well,
so after 8 s of silence the first word reads [0.0, 8.28]. The pipeline already cuts
words at sentence ends to twice the median word length; what OpenAI's Whisper does at
segment boundaries is done here: the first word after a pause, and the first and last
words of a segment that run over the segment's own timestamps by more than half a
second, are cut to a length bounded by the median word length (at most 0.7 s) or to the
segment's timestamp. Segments keep the model's timestamps.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace

from ovtrio.audio.windows import Timed

_LONGEST_MEDIAN = 0.7


def bounded_words(segments: Sequence[Timed], words: Sequence[Timed], last_speech: float = 0.0) -> list[Timed]:
    """`words` (a window's, in order) with the bounds above, given the window's `segments`
    and where speech last ended before them (`last_speech`, the same clock). Words that
    cannot be matched to the segments' text are returned as they are."""
    durations = [word.end - word.start for word in words if word.end > word.start]
    groups = _by_segment(segments, words)
    if not durations or groups is None:
        return list(words)
    median = min(_LONGEST_MEDIAN, statistics.median(durations))
    longest = 2 * median
    bounded: list[Timed] = []
    for segment, group in zip(segments, groups, strict=True):
        if not group:
            continue
        first = group[0]
        after_pause = first.end - last_speech > 4 * median
        if after_pause and (
            first.end - first.start > longest or (len(group) > 1 and group[1].end - first.start > 2 * longest)
        ):
            if len(group) > 1 and group[1].end - group[1].start > longest:
                boundary = group[1].end - longest
                first = replace(first, end=boundary)
                group[1] = replace(group[1], start=boundary)
            first = replace(first, start=max(0.0, first.end - longest))
        if segment.start < first.end and segment.start - 0.5 > first.start:
            # A first word that starts well before its segment: cut to the segment.
            first = replace(first, start=max(0.0, min(first.end - median, segment.start)))
        group[0] = first
        last = group[-1]
        if segment.end > last.start and segment.end + 0.5 < last.end:
            group[-1] = replace(last, end=max(last.start + median, segment.end))
        bounded += group
        last_speech = segment.end
    return bounded


def _by_segment(segments: Sequence[Timed], words: Sequence[Timed]) -> list[list[Timed]] | None:
    """The words of each segment, told by their text: the words' texts, joined, begin
    the segments' (a window's words stop before a word its first pass did not finish)
    or go on past them (the words of what the window's last segment was cut from, past
    the audio's end: they go with that segment); None if neither."""
    text = "".join(segment.text for segment in segments)
    words_text = "".join(word.text for word in words)
    if not segments or not (text.startswith(words_text) or words_text.startswith(text)):
        return None
    ends = []
    at = 0
    for segment in segments:
        at += len(segment.text)
        ends.append(at)
    groups: list[list[Timed]] = [[] for _ in segments]
    index, at = 0, 0
    for word in words:
        while index < len(ends) - 1 and at >= ends[index]:
            index += 1
        groups[index].append(word)
        at += len(word.text)
    return groups
