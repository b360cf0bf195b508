"""What the scheduler keeps for each request, from submission to its last output, and
the consumer's end of it (RequestStream).

An ovtrio request (ActiveRequest) becomes one or more engine requests (EngineRequest:
one per prompt and sibling, or one beam search) that produce its choices (Sequence).
Until the loop has added it to the engine between two steps, it waits as an Admission.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from ovtrio.scheduler.outputs import RequestOutput
from ovtrio.scheduler.params import GenerationRequest, UnsupportedParams
from ovtrio.scheduler.speculation import SpeculationTally
from ovtrio.scheduler.text_output import Detokenizer, StopMatcher

if TYPE_CHECKING:
    from ovtrio.scheduler.reads import HandleOutput


@dataclass(eq=False)
class Sequence:
    """One choice: its text decoder, its stop strings, and what it holds back until the
    next delta (see delivery.py)."""

    index: int
    detokenizer: Detokenizer
    stops: StopMatcher
    prompt_tokens: int = 0
    finish_reason: str | None = None
    stop: str | None = None  # the stop string that ended it, when one did
    generated: int = 0
    # When its first and its latest tokens were read off the engine (time.monotonic()).
    first_token_at: float | None = None
    last_token_at: float | None = None
    held_text: str = ""
    held_ids: list[int] = field(default_factory=list)
    held_logprobs: list[float] | None = None
    speculation: SpeculationTally | None = None  # counts drafted and accepted tokens when speculating


@dataclass(eq=False)
class EngineRequest:
    """One engine request of an ovtrio request, and the choices it produces: one, or
    the n best beams of a beam search (which the engine reports only at the end)."""

    handle: Any  # openvino_genai.GenerationHandle; dropping it cancels the engine request
    sequences: list[Sequence]
    beam_search: bool = False
    done: bool = False
    # Outputs read off the engine after its request paused, delivered once it resumes
    # (delivery.py).
    unread: list[HandleOutput] = field(default_factory=list)


@dataclass(eq=False)
class ActiveRequest:
    """An ovtrio request from submission until its channel closes."""

    request_id: int
    channel: trio.MemorySendChannel[RequestOutput]
    prompt_tokens: int
    logprobs: bool
    weight: int = 1  # engine sequences it runs (GenerationRequest.sequences), or places reserved
    # Undelivered outputs at which the request pauses (see admission.py).
    pause_at: int = 128
    parts: list[EngineRequest] = field(default_factory=list)
    sequences: list[Sequence] = field(default_factory=list)
    sent_first_token: bool = False
    submitted_at: float = 0.0  # time.monotonic() when submitted
    added_at: float | None = None  # time.monotonic() when taken into the engine
    # trio.current_time() since its consumer lags: its handles are not read
    # (Delivery.read_outputs) until it catches up.
    paused_at: float | None = None

    def send(self, output: RequestOutput) -> bool:
        """Queue `output` for the consumer; False if it has left. Pauses the request
        when its consumer has left `pause_at` outputs unread."""
        try:
            self.channel.send_nowait(output)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        if self.paused_at is None and self.undelivered() >= self.pause_at:
            self.paused_at = trio.current_time()
        return True

    def undelivered(self) -> int:
        """Outputs sent that the consumer has not received yet."""
        return self.channel.statistics().current_buffer_used

    def close(self) -> None:
        """Cancel what still runs in the engine and end the consumer's stream.

        A handle's `cancel()` is safe at any time, during a step too (scheduler.py).
        """
        # Frees the KV cache at the next step; the handle's destructor would too, but
        # saying so is clearer than relying on reference counting.
        for part in self.parts:
            if not part.done:
                part.handle.cancel()
            part.handle = None
        self.channel.close()


@dataclass(eq=False)
class Admission:
    """A submitted request waiting for the loop to add it to the engine between steps,
    or a reservation of running places (intake.reserve) waiting for room."""

    active: ActiveRequest
    request: GenerationRequest | None  # None: places reserved for work beside the engine
    added: trio.Event = field(default_factory=trio.Event)
    error: UnsupportedParams | None = None

    @property
    def engine_requests(self) -> int:
        """How many engine requests it will become (none for a reservation)."""
        return 0 if self.request is None else self.request.engine_requests

    @property
    def generation(self) -> GenerationRequest:
        """The request to generate for: only a submitted request has one."""
        assert self.request is not None, "a reservation generates nothing"
        return self.request


class RequestStream:
    """The consumer's end of one request: its outputs in arrival order.

    `receive_available()` waits for at least one output and returns all that are
    queued, so a consumer that fell behind catches up in one go instead of writing one
    chunk per engine step.
    """

    def __init__(
        self,
        request_id: int,
        receive: trio.MemoryReceiveChannel[RequestOutput],
        received: Callable[[], None] = lambda: None,
    ) -> None:
        """`received` is called after each batch is taken (the scheduler resumes a
        paused request once its consumer has caught up)."""
        self.request_id = request_id
        self._receive = receive
        self._received = received

    async def receive_available(self) -> list[RequestOutput]:
        """Wait for the next outputs; [] once the request is over (channel closed)."""
        try:
            outputs = [await self._receive.receive()]
        except trio.EndOfChannel:
            return []
        while True:
            try:
                outputs.append(self._receive.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                self._received()
                return outputs
