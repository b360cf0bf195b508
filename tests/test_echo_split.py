"""EchoedPrompt: the scored prompt split off the front of a sequence's output, as the
engine returns it under echo (measured shapes; see ovtrio/scheduler/echo.py)."""

from __future__ import annotations

import pytest

from ovtrio.scheduler.echo import EchoedPrompt, PromptNotScored

PROMPT = [11, 12, 13]


def test_the_prompt_comes_off_the_first_read_and_its_first_score_is_none():
    echo = EchoedPrompt(0, PROMPT)
    ids, logprobs, prompt = echo.take([11, 12, 13, 99], [1.0, -2.0, -3.0, -0.5])
    assert (ids, logprobs) == ([99], [-0.5])
    assert prompt is not None and prompt.token_ids == PROMPT and prompt.logprobs == [None, -2.0, -3.0]
    assert echo.complete


def test_a_prompt_split_over_reads_is_sent_once_complete():
    echo = EchoedPrompt(1, PROMPT)
    assert echo.take([11, 12], [1.0, -2.0]) == ([], [], None)
    ids, logprobs, prompt = echo.take([13], [-3.0])
    assert ids == [] and prompt is not None and prompt.index == 1 and prompt.logprobs == [None, -2.0, -3.0]


@pytest.mark.parametrize(
    "ids, logprobs",
    [
        ([11, 12, 13, 99], [-0.5]),  # a cached prompt: ids echoed, scores only for computed positions
        ([99], [0.0]),  # a fully cached prompt with max_new_tokens 0
    ],
)
def test_a_prompt_the_engine_did_not_score_is_an_error_not_partial_scores(ids, logprobs):
    with pytest.raises(PromptNotScored):
        EchoedPrompt(0, PROMPT).take(ids, logprobs)
