"""ReasoningSplitter, pure logic (no server): <think>…</think> outputs of Qwen3 and
DeepSeek-R1 style models, unary and fed in arbitrary pieces (every single character,
every two-piece split, random splits with fixed seeds), which must agree exactly."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from ovtrio.parsing import ReasoningSplitter
from splitting import splittings


@dataclass
class Sample:
    id: str
    text: str
    reasoning: str
    content: str
    start_in_reasoning: bool = False
    open_tag: str = "<think>"
    close_tag: str = "</think>"

    def splitter(self) -> ReasoningSplitter:
        return ReasoningSplitter(self.start_in_reasoning, self.open_tag, self.close_tag)


SAMPLES = [
    Sample(
        "qwen3",
        "<think>\nThe user asks 2+2. That is 4.\n</think>\n\nThe answer is 4.",
        "\nThe user asks 2+2. That is 4.\n",
        "The answer is 4.",
    ),
    Sample(
        "r1_template_opened_think",  # the prompt ends with "<think>\n"
        "Okay, so the user wants a haiku.\n</think>\n\nAutumn moonlight—\na worm digs silently\ninto the chestnut.",
        "Okay, so the user wants a haiku.\n",
        "Autumn moonlight—\na worm digs silently\ninto the chestnut.",
        start_in_reasoning=True,
    ),
    Sample(
        "started_in_reasoning_and_repeats_open_tag",
        "<think>\nHmm.</think>Yes.",
        "\nHmm.",
        "Yes.",
        start_in_reasoning=True,
    ),
    Sample("no_tags", "Plain answer, no thinking.", "", "Plain answer, no thinking."),
    Sample("no_tags_leading_space", "\n  Plain answer.", "", "\n  Plain answer."),
    Sample("whitespace_before_open_tag", "\n<think>x < y</think> \n y", "x < y", "y"),
    Sample("empty_reasoning_qwen3_no_think", "<think>\n\n</think>\n\nHi!", "\n\n", "Hi!"),
    Sample("truncated_reasoning", "<think>\nStill thinking about </thi", "\nStill thinking about </thi", ""),
    Sample("truncated_started_in_reasoning", "Let me see", "Let me see", "", start_in_reasoning=True),
    Sample("only_reasoning", "<think>done</think>\n\n", "done", ""),
    Sample(
        "tags_in_reasoning_and_content",
        "<think>I should mention the <think> tag and </thin k>.</think>Use <think> and </think> tags.",
        "I should mention the <think> tag and </thin k>.",
        "Use <think> and </think> tags.",
    ),
    Sample(
        "open_tag_later_is_content", "Answer: <think>not reasoning</think>", "", "Answer: <think>not reasoning</think>"
    ),
    Sample("stray_close_tag_is_content", "abc</think>def", "", "abc</think>def"),
    Sample("looks_like_tag", "<thinking>is not the tag</thinking>", "", "<thinking>is not the tag</thinking>"),
    Sample("partial_open_tag_only", "<thi", "", "<thi"),
    Sample("unicode", "<think>考虑一下… 🤔</think>\n答案是 42。", "考虑一下… 🤔", "答案是 42。"),
    Sample(
        "tool_call_after_reasoning",
        '<think>Need weather.</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>',
        "Need weather.",
        '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>',
    ),
    Sample(
        "custom_tags",
        "<|begin_of_thought|>ponder<|end_of_thought|>\nresult",
        "ponder",
        "result",
        open_tag="<|begin_of_thought|>",
        close_tag="<|end_of_thought|>",
    ),
    Sample("empty", "", "", ""),
    Sample("empty_started_in_reasoning", "", "", "", start_in_reasoning=True),
]


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: s.id)
def test_unary_split(sample: Sample) -> None:
    assert sample.splitter().parse(sample.text) == (sample.reasoning, sample.content)


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: s.id)
def test_streaming_matches_unary_for_any_split(sample: Sample) -> None:
    for pieces in splittings(sample.text):
        splitter = sample.splitter()
        outputs = [splitter.feed(piece) for piece in pieces] + [splitter.finish()]
        reasoning = "".join(r for r, _ in outputs)
        content = "".join(c for _, c in outputs)
        assert (reasoning, content) == (sample.reasoning, sample.content), pieces


def test_partial_tags_are_held_back() -> None:
    splitter = ReasoningSplitter()
    assert splitter.feed("<thi") == ("", "")
    assert splitter.feed("nk>Let me think") == ("Let me think", "")
    assert splitter.feed(". </th") == (". ", "")
    assert splitter.feed("ink>\n") == ("", "")
    assert splitter.feed("\nHello") == ("", "Hello")
    assert splitter.feed(" </think>") == ("", " </think>")
    assert splitter.finish() == ("", "")


def test_reasoning_streams_as_it_comes() -> None:
    splitter = ReasoningSplitter(start_in_reasoning=True)
    assert splitter.feed("First") == ("First", "")
    assert splitter.feed(" step <") == (" step ", "")  # "<" may begin </think>
    assert splitter.feed("b>") == ("<b>", "")
    assert splitter.finish() == ("", "")


def test_content_streams_without_delay_when_not_reasoning() -> None:
    splitter = ReasoningSplitter()
    assert splitter.feed("Hi") == ("", "Hi")
    assert splitter.feed(" <think>") == ("", " <think>")
