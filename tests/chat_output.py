"""Chat objects written from model text without a server: the text goes through an
OutputStage as the scheduler would deliver it, and a ChatWriter writes the result."""

from __future__ import annotations

import random
from collections.abc import Callable

from ovtrio.api.chat.writer import ChatWriter
from ovtrio.api.chunks import Envelope
from ovtrio.output import Outcome, OutputStage, ResultCollector
from ovtrio.scheduler import Completed, Delta


def writer() -> ChatWriter:
    return ChatWriter(Envelope("chatcmpl-test", "m", "fp_test"))


def unary_chat(make_stage: Callable[[], OutputStage], text: str, usage: Completed = Completed(10, 20)) -> dict:
    """The chat.completion body for `text`, delivered in one delta."""
    outcome = ResultCollector(1).add(make_stage().feed([Delta(0, text, [], "stop"), usage]))
    assert isinstance(outcome, Outcome)
    return writer().completion(outcome)


def streamed_chat(make_stage: Callable[[], OutputStage], text: str, rng: random.Random, most: int) -> list[dict]:
    """The chunks for `text`, delivered in random pieces of 1 to `most` characters."""
    stage, shaper = make_stage(), writer()
    chunks = shaper.opening()
    at = 0
    while at < len(text):
        size = rng.randint(1, most)
        chunks += shaper.write(stage.feed([Delta(0, text[at : at + size], [])]))
        at += size
    return chunks + shaper.write(stage.feed([Delta(0, "", [], "stop")]))
