"""What a typed stream event costs per token, against the dict it replaced.

Builds and writes to JSON N `response.output_text.delta` events (one a token) three
ways: a dict and json.dumps (the reference: how they were written before), the
dataclass the Responses API writes (ovtrio/api/responses/objects.py) and pydantic's
serializer, and a pydantic model with model_dump_json; the same for the Messages API's
content_block_delta. Prints microseconds per event and the ratio to the dict.

    python -m bench typed_events [--events N]
"""

from __future__ import annotations

import argparse
import json
import timeit
from typing import Any

from pydantic import BaseModel
from pydantic_core import to_json

from bench.driver.results import Outcome
from ovtrio.api.messages.objects import ContentBlockDelta, TextPiece
from ovtrio.api.responses.objects import OutputTextDelta


class DeltaModel(BaseModel):
    type: str = "response.output_text.delta"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int = 0
    delta: str
    logprobs: list[Any]


def as_dict(i: int) -> bytes:
    event = {
        "type": "response.output_text.delta",
        "sequence_number": i,
        "item_id": "msg_0123456789abcdef",
        "output_index": 0,
        "content_index": 0,
        "delta": " word",
        "logprobs": [],
    }
    return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()


def as_dataclass(i: int) -> bytes:
    return to_json(
        OutputTextDelta(sequence_number=i, item_id="msg_0123456789abcdef", output_index=0, delta=" word", logprobs=[])
    )


def as_model(i: int) -> bytes:
    model = DeltaModel(sequence_number=i, item_id="msg_0123456789abcdef", output_index=0, delta=" word", logprobs=[])
    return model.model_dump_json().encode()


def block_dict(i: int) -> bytes:
    event = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " word"}}
    return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()


def block_dataclass(i: int) -> bytes:
    return to_json(ContentBlockDelta(index=0, delta=TextPiece(text=" word")))


def per_event(write: Any, n: int) -> float:
    return min(timeit.repeat(lambda: [write(i) for i in range(n)], number=1, repeat=5)) / n


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=100_000, help="events written per timing")


def run(args: argparse.Namespace) -> Outcome:
    n = args.events
    summary = {}
    assert json.loads(as_dataclass(3)) == json.loads(as_dict(3)) == json.loads(as_model(3))
    assert json.loads(block_dataclass(3)) == json.loads(block_dict(3))
    for name, reference, ways in (
        ("response.output_text.delta", as_dict, {"dataclass + to_json": as_dataclass, "pydantic model": as_model}),
        ("content_block_delta", block_dict, {"dataclass + to_json": block_dataclass}),
    ):
        base = per_event(reference, n)
        print(f"{name}: dict + json.dumps {base * 1e6:.2f} us/event")
        summary[f"{name}: dict + json.dumps us/event"] = base * 1e6
        for way, write in ways.items():
            cost = per_event(write, n)
            print(f"{name}: {way} {cost * 1e6:.2f} us/event ({cost / base:.2f}x the dict)")
            summary[f"{name}: {way} us/event"] = cost * 1e6
    return Outcome(summary)
