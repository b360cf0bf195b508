"""How a window's output joins the next (ovtrio/audio/windows.py), fed records shaped
as WhisperPipeline (openvino-genai 2026.4.1) reports them for one 30 s window.

Given 30 s of someone who speaks on past the window's end, the pipeline's first pass
ends inside a sentence: it drops that unfinished segment and goes on from the end of the
last complete one, hearing the window's last seconds and then nothing, so it reports the
cut sentence as a segment that ends past the window (seen: `[28.48, 30.48] " Smokey
fires like flame"` for the window at 30 s, which the server gave as [58.48, 60.48] and
then `[60.00, 62.08] " and he."` from the next window). What the tests below check: a
window keeps its first pass, the next starts at the end of its last complete segment, and
a sentence the window cut is one segment, written once, by the next window.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ovtrio.audio.windows import LEAST_ADVANCE_SECONDS, Timed, WindowOutput, first_pass_count, stitch


@dataclass(frozen=True)
class Chunk:  # WhisperDecodedResultChunk
    start_ts: float
    end_ts: float
    text: str


@dataclass(frozen=True)
class WordTiming:  # WhisperWordTiming
    word: str
    start_ts: float
    end_ts: float
    token_ids: list[int] = field(default_factory=lambda: [1])


def output(chunks: list[Chunk], first: int, went_on: bool = True) -> WindowOutput:
    """The pipeline's report (no words) when its first pass wrote the first `first` chunks."""
    return WindowOutput(chunks, [], "".join(chunk.text for chunk in chunks[:first]), 0, went_on)


# The window at 30 s of the example: its first pass's complete segments, then the pass
# from 28.48 s that heard 1.52 s of the sentence and silence after it.
FIRST_PASS = [
    Chunk(0.0, 6.2, " Only you can prevent"),
    Chunk(6.2, 14.9, " forest fires, said the bear."),
    Chunk(14.9, 22.4, " The campers listened."),
    Chunk(22.4, 28.48, " They put out the fire."),
]
SECOND_PASS = [Chunk(28.48, 30.48, " Smokey fires like flame")]


def test_a_window_keeps_its_first_pass_and_the_next_starts_at_its_last_complete_segment():
    kept = stitch(output(FIRST_PASS + SECOND_PASS, first=4), seconds=30.0, full=True)
    assert kept.advance == 28.48
    assert [(s.start, s.end, s.text) for s in kept.segments] == [(c.start_ts, c.end_ts, c.text) for c in FIRST_PASS]
    assert all(s.end <= 30.0 for s in kept.segments)
    assert not kept.whole


def test_the_words_of_the_unfinished_segment_are_left_to_the_next_window():
    """The pipeline times every word its first pass wrote, those of the segment it
    dropped too (" Smokey fires" heard before the window's end)."""
    words = [
        WordTiming(" They", 22.4, 23.0, [10]),
        WordTiming(" put", 23.0, 24.1, [11]),
        WordTiming(" out", 24.1, 25.0, [12]),
        WordTiming(" the", 25.0, 25.6, [13]),
        WordTiming(" fire.", 25.6, 28.5, [14, 15]),  # ends a little past the segment
        WordTiming(" Smokey", 28.4, 29.3, [16, 17]),  # starts a little before it ends
        WordTiming(" fires", 29.3, 30.0, [18]),
    ]
    report = WindowOutput(FIRST_PASS + SECOND_PASS, words, "".join(c.text for c in FIRST_PASS), 6, True)
    kept = stitch(report, seconds=30.0, full=True)
    assert [w.text for w in kept.words] == [" They", " put", " out", " the", " fire."]
    assert kept.words[-1].end == 28.48, "no word runs past where the next window starts"


def test_a_lone_segment_without_an_end_is_cut_before_when_it_starts_late_enough():
    lone = [Chunk(0.0, 12.0, " One."), Chunk(12.0, -1.0, " And then it went on and")]
    kept = stitch(output(lone, first=2, went_on=False), seconds=30.0, full=True)
    assert kept.advance == 12.0 and [s.text for s in kept.segments] == [" One."]
    early = [Chunk(1.0, -1.0, " Talking without a pause")]
    kept = stitch(output(early, first=1, went_on=False), seconds=30.0, full=True)
    assert kept.advance == 30.0 and kept.segments == [Timed(1.0, 30.0, " Talking without a pause")]


def test_a_first_pass_that_ends_too_early_is_not_cut_there():
    """A cut before LEAST_ADVANCE_SECONDS would have the next window hear mostly the same
    audio: the window is kept to its end instead, what the pipeline reported past it cut."""
    chunks = [Chunk(0.0, 2.0, " Hm."), Chunk(2.0, 29.0, " A very long sentence"), Chunk(29.0, 33.5, " past")]
    assert LEAST_ADVANCE_SECONDS > 2.0
    kept = stitch(output(chunks, first=1), seconds=30.0, full=True)
    assert kept.advance == 30.0
    assert kept.segments == [
        Timed(0.0, 2.0, " Hm."),
        Timed(2.0, 29.0, " A very long sentence"),
        Timed(29.0, 30.0, " past"),
    ]


def test_the_last_window_ends_at_the_audios_end():
    """The audio's end is where the speech ends: what the model writes of the silence
    after it (timestamps up to 30 s after its pass started) is cut there."""
    chunks = [Chunk(0.0, 5.0, " The end."), Chunk(5.0, 12.5, " Thanks"), Chunk(12.5, 20.0, " for watching.")]
    kept = stitch(output(chunks, first=1), seconds=10.0, full=False)
    assert kept.advance == 10.0
    assert kept.segments == [Timed(0.0, 5.0, " The end."), Timed(5.0, 10.0, " Thanks")]
    assert kept.segments[-1].end <= 10.0


def test_segments_and_words_never_go_back_in_time():
    chunks = [Chunk(0.0, 4.0, " a"), Chunk(3.5, 6.0, " b"), Chunk(7.0, 6.5, " c")]
    words = [WordTiming(" a", 0.0, 4.2), WordTiming(" b", 3.9, 6.0), WordTiming(" c", 7.0, 6.9)]
    kept = stitch(WindowOutput(chunks, words, "", 0, False), seconds=10.0, full=False)
    for items in (kept.segments, kept.words):
        assert all(item.start <= item.end for item in items)
        assert all(a.end <= b.start for a, b in itertools.pairwise(items))


def test_the_first_pass_is_told_by_its_text():
    texts = [" One", " two.", " Three"]
    assert first_pass_count(texts, " One two.") == 2
    assert first_pass_count(texts, "") == 0
    # A character split across two segments decodes otherwise alone: the nearest length.
    assert first_pass_count([" caf\ufffd", "\ufffd ok.", " more"], " café ok.") == 2


@dataclass(frozen=True)
class Sentence:
    start: float
    end: float
    text: str


def speaker(seconds: float) -> list[Sentence]:
    """Sentences of 3.1-8.4 s with pauses, some across every window's end."""
    sentences, at, index = [], 0.6, 0
    while at < seconds - 1:
        length = 3.1 + (index * 2.3) % 5.3
        end = min(at + length, seconds - 0.2)
        sentences.append(Sentence(round(at, 2), round(end, 2), f" Sentence {index}."))
        at, index = end + 0.4, index + 1
    return sentences


def pipeline_window(sentences: list[Sentence], start: float, seconds: float, full: bool) -> WindowOutput:
    """What openvino-genai 2026.4.1 reports for the window of `seconds` from `start`: its
    first pass writes the sentences it hears whole; one it hears cut it drops, and its next
    pass (from the last complete one's end) writes the cut sentence as heard, ending past
    the window, and the ones after it."""
    end = start + seconds
    heard = [s for s in sentences if s.end > start + 0.01 and s.start < end]
    first = [s for s in heard if s.end <= end]
    cut = [s for s in heard if s.end > end]
    chunks = [Chunk(round(max(s.start, start) - start, 2), round(s.end - start, 2), s.text) for s in heard]
    # A sentence is one word here, timed as far as the window heard it.
    words = [WordTiming(c.text, c.start_ts, min(c.end_ts, seconds)) for c in chunks]
    went_on = full and bool(cut) and bool(first)
    text = "".join(s.text for s in first) if went_on else "".join(c.text for c in chunks)
    return WindowOutput(chunks, words, text, len(first) if went_on else len(words), went_on)


def test_over_long_audio_each_sentence_is_one_segment_in_order():
    seconds = 95.0
    sentences = speaker(seconds)
    assert any(s.start < 30 < s.end for s in sentences) and any(s.start < 60 < s.end for s in sentences)
    segments: list[Timed] = []
    words: list[Timed] = []
    start = 0.0
    while start < seconds:
        length = min(30.0, seconds - start)
        full = start + length < seconds
        kept = stitch(pipeline_window(sentences, start, length, full), length, full)
        segments += [Timed(start + s.start, start + s.end, s.text) for s in kept.segments]
        words += [Timed(start + w.start, start + w.end, w.text) for w in kept.words]
        start += kept.advance
    assert [(round(s.start, 2), round(s.end, 2), s.text) for s in segments] == [
        (s.start, s.end, s.text) for s in sentences
    ]
    assert [w.text for w in words] == [s.text for s in sentences]
    for items in (segments, words):
        assert all(a.end <= b.start + 1e-9 for a, b in itertools.pairwise(items))
