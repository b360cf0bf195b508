"""Delivery decides, the loop acts: what a delivery ends (a stop string's cancel, a
completed request, a consumer that left) comes back as Decisions, and nothing is
cancelled or ended before the loop applies them. Pure logic with the fake engine's
handles and vocabulary."""

from __future__ import annotations

import math

import pytest
import trio

from fake_engine import VOCABULARY, FakeHandle, Observed
from ovtrio.scheduler import Completed, Delta, Failed, SamplingParams
from ovtrio.scheduler.delivery import Delivery
from ovtrio.scheduler.reads import StepOutput
from ovtrio.scheduler.requests import ActiveRequest, EngineRequest


def one_request(delivery: Delivery, active: dict[int, ActiveRequest], params: SamplingParams, request_id: int = 7):
    send, receive = trio.open_memory_channel(math.inf)
    request = ActiveRequest(request_id=request_id, channel=send, prompt_tokens=1, logprobs=False)
    sequence = delivery.new_sequence(0, [1], params)
    request.sequences.append(sequence)
    part = EngineRequest(FakeHandle(left=10, dropped=False), [sequence])
    request.parts.append(part)
    active[request.request_id] = request
    return request, part, sequence, receive


async def test_a_stop_string_is_decided_and_left_to_the_loop():
    active: dict[int, ActiveRequest] = {}
    delivery = Delivery(None, VOCABULARY, 1, active, Observed())
    request, part, sequence, receive = one_request(delivery, active, SamplingParams(max_new_tokens=10, stop=("ab",)))
    decisions = delivery.deliver([StepOutput(request, part, sequence, [1, 2], [], None)], steps=1)
    assert decisions.cancels == [part] and decisions.ends == {7: "abort"}
    # Decided only: the engine request still runs and the request is still in the table.
    assert not part.handle.cancelled and 7 in active
    messages = [receive.receive_nowait(), receive.receive_nowait()]
    assert messages == [Delta(0, "", [1, 2], "stop", None, stop="ab"), Completed(1, 2)]


async def test_a_consumer_that_left_is_decided_once():
    active: dict[int, ActiveRequest] = {}
    delivery = Delivery(None, VOCABULARY, 1, active, Observed())
    request, part, sequence, receive = one_request(delivery, active, SamplingParams(max_new_tokens=10))
    receive.close()
    outputs = [StepOutput(request, part, sequence, [1], [], None) for _ in range(3)]
    decisions = delivery.deliver(outputs, steps=1)
    assert decisions.ends == {7: "abort"} and decisions.cancels == []
    assert sequence.generated == 1  # what came after the consumer left was not delivered


class EngineDetokenizer:
    """The engine's detokenizer as it treats an id it has no entry for: no text, no error."""

    def decode(self, batch: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        return ["".join(VOCABULARY.token_bytes[i].decode() for i in row if i < 3) for row in batch]


@pytest.mark.parametrize("detokenizer", ["byte-table", "engine"])
async def test_an_id_outside_the_vocabulary_fails_its_request_alone(detokenizer):
    active: dict[int, ActiveRequest] = {}
    if detokenizer == "byte-table":
        delivery = Delivery(None, VOCABULARY, 1, active, Observed())
    else:
        delivery = Delivery(EngineDetokenizer(), None, 1, active, Observed(), vocabulary_size=3)
    params = SamplingParams(max_new_tokens=10)
    bad, bad_part, bad_sequence, bad_receive = one_request(delivery, active, params)
    good, good_part, good_sequence, good_receive = one_request(delivery, active, params, request_id=8)
    outputs = [
        StepOutput(bad, bad_part, bad_sequence, [1, 3], [], None),
        StepOutput(good, good_part, good_sequence, [1], [], None),
    ]
    decisions = delivery.deliver(outputs, steps=1)
    assert decisions.ends == {7: "error"}
    failed = bad_receive.receive_nowait()
    assert isinstance(failed, Failed) and failed.code == "token_outside_vocabulary", failed
    assert "token id 3, outside its vocabulary of 3 tokens" in failed.message
    assert good_receive.receive_nowait() == Delta(0, "a", [1])
