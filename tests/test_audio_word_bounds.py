"""Word timings bounded as OpenAI's Whisper bounds them (ovtrio/audio/word_bounds.py):
the pipeline's alignment gives a word after a pause the pause too."""

from __future__ import annotations

import pytest

from ovtrio.audio.windows import Timed
from ovtrio.audio.word_bounds import bounded_words

AFTER_SILENCE = [Timed(8.0, 10.4, " Hello there, my friend.")]
# What the pipeline gives for 8 s of silence and then speech: the first word from 0.0.
ALIGNED = [
    Timed(0.0, 8.28, " Hello"),
    Timed(8.28, 8.9, " there,"),
    Timed(8.9, 9.3, " my"),
    Timed(9.3, 10.4, " friend."),
]


def test_the_first_word_after_silence_is_cut_to_the_speech():
    words = bounded_words(AFTER_SILENCE, ALIGNED)
    # The median word lasts 0.86 s, of which at most 0.7 counts: the first word after the pause
    # keeps twice that, then starts no earlier than its end less the median (OpenAI's rule).
    assert words[0] == Timed(pytest.approx(7.58), 8.28, " Hello")
    assert words[1:] == ALIGNED[1:]


def test_a_first_word_that_starts_well_before_its_segment_is_cut_to_it():
    segments = [Timed(0.0, 3.0, " One two."), Timed(12.0, 13.0, " Three.")]
    words = [Timed(0.0, 0.5, " One"), Timed(0.5, 3.0, " two."), Timed(3.0, 12.5, " Three.")]
    bounded = bounded_words(segments, words)
    assert bounded[2].start >= 11.5 and bounded[2].end == 12.5
    assert bounded[:2] == words[:2]


def test_a_last_word_that_runs_well_past_its_segment_is_cut_to_it():
    segments = [Timed(0.0, 2.0, " Go on.")]
    words = [Timed(0.0, 0.6, " Go"), Timed(0.6, 9.0, " on.")]
    assert bounded_words(segments, words)[-1] == Timed(0.6, 2.0, " on.")


def test_words_close_to_their_segments_are_left_as_they_are():
    segments = [Timed(0.2, 2.0, " A b c."), Timed(2.0, 4.0, " D e.")]
    words = [
        Timed(0.0, 0.6, " A"),
        Timed(0.6, 1.2, " b"),
        Timed(1.2, 2.1, " c."),
        Timed(2.1, 3.0, " D"),
        Timed(3.0, 4.0, " e."),
    ]
    assert bounded_words(segments, words) == words


def test_words_that_are_not_the_segments_text_are_left_as_they_are():
    assert bounded_words(AFTER_SILENCE, [Timed(0.0, 8.28, " Goodbye")]) == [Timed(0.0, 8.28, " Goodbye")]
    assert bounded_words(AFTER_SILENCE, []) == []
