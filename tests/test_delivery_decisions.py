"""Delivery decides, the loop acts: what a delivery ends (a stop string's cancel, a
completed request, a consumer that left) comes back as Decisions, and nothing is
cancelled or ended before the loop applies them. Pure logic with the fake engine's
handles and vocabulary."""

from __future__ import annotations

import math

import trio

from fake_engine import VOCABULARY, FakeHandle, Observed
from ovtrio.scheduler import Completed, Delta, SamplingParams
from ovtrio.scheduler.delivery import Delivery
from ovtrio.scheduler.reads import StepOutput
from ovtrio.scheduler.requests import ActiveRequest, EngineRequest


def one_request(delivery: Delivery, active: dict[int, ActiveRequest], params: SamplingParams):
    send, receive = trio.open_memory_channel(math.inf)
    request = ActiveRequest(request_id=7, channel=send, prompt_tokens=1, logprobs=False)
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
