"""What both schedulers keep of the requests they take on, whichever way they run them.

A request is submitted, waits in a queue (arrival order) until the loop takes it to the
engine, runs there, and ends: finished, left by its consumer, failed, or cancelled
because its consumer stopped reading. RequestIntake holds that bookkeeping: the queue
and the running requests, submit() and its refusals (NotAccepting, Overloaded), the
end of a request (`_abort`), draining, the slow-reader pause and timeout (admission.py
says why), fail_all() and the counters that go with them.

What differs stays with each scheduler, in the hooks below: how much room the engine
has (`_room_in_engine`), which requests it can run at all (`_refuse_unsupported`), what
it frees when a running request ends (`_left_engine`), and the loop that takes queued
requests to the engine: the continuous-batching Scheduler (scheduler.py) or the
one-at-a-time StatefulScheduler (stateful.py).
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import trio

from ovtrio.scheduler.admission import AdmissionLimits, Overloaded, RetryHint
from ovtrio.scheduler.delivery import Decisions, Delivery
from ovtrio.scheduler.observer import NoObserver, RequestObserver
from ovtrio.scheduler.outputs import Failed, RequestOutput
from ovtrio.scheduler.params import GenerationRequest
from ovtrio.scheduler.requests import ActiveRequest, Admission, RequestStream

log = logging.getLogger("ovtrio.scheduler")


class NotAccepting(RuntimeError):
    """The scheduler takes no new requests: it is draining or not running."""


# Failed.code of the requests ended because the server is shutting down.
SHUTTING_DOWN = "shutting_down"


class RequestIntake:
    """The requests a scheduler has taken on, from submit() to their end. The loop of
    the subclass moves them from `_queued` to `_active` and sets `_running`."""

    # Whether the engine's outputs carry log-probabilities to pass on.
    _scores_tokens = True

    def __init__(
        self,
        tokenizer: Any,
        vocabulary: Any,
        stream_interval: int,
        limits: AdmissionLimits,
        observer: RequestObserver | None,
    ) -> None:
        self._limits = limits
        # Requests in the engine, and those waiting for room there (in arrival order).
        self._active: dict[int, ActiveRequest] = {}
        self._queued: dict[int, Admission] = {}
        # Requests waiting for their output constraint to be checked (`checked`): they
        # wait as queued ones do, and count as such toward the queue's bound, so a flood
        # of new constraints is refused as any other is, not left to wait without end.
        self._checking = 0
        self._observer = observer or NoObserver()
        self._retry_hint = RetryHint()
        self._rejected = 0
        self._slow_readers_cancelled = 0
        self._prompt_tokens = 0
        self._delivery = Delivery(tokenizer, vocabulary, stream_interval, self._active, self._observer)
        self._ids = itertools.count(1)
        # Set to wake the loop: a request arrived, a consumer caught up, ...
        self._work = trio.Event()
        self._running = False
        self._accepting = True
        # Set whenever the last request in flight leaves; a fresh one per wait (idle()).
        self._emptied = trio.Event()

    # ---- what each scheduler says of its engine -----------------------------------------

    def _room_in_engine(self) -> int:
        """Requests the engine can take at once, beyond those queued for it."""
        raise NotImplementedError

    def _describe_load(self) -> str:
        """What runs and waits, for the Overloaded message."""
        raise NotImplementedError

    def _refuse_unsupported(self, request: GenerationRequest) -> None:
        """Raise UnsupportedParams for a request the engine cannot run at all."""

    def _left_engine(self, active: ActiveRequest, outcome: str | None) -> None:
        """A running request has ended (called before its channel closes), with the
        outcome `_abort` reports for its unfinished choices."""

    def _engine_wanted(self) -> None:
        """The loop has work between engine steps (a request to add, one to resume):
        a scheduler whose engine runs on by itself hands it back to the loop."""

    def _wake(self) -> None:
        self._work.set()
        self._engine_wanted()

    # ---- submission side (called from request handlers) --------------------------------

    def check_capacity(self) -> None:
        """Raise Overloaded if a request submitted now would be refused: the queue is
        full beyond what the engine can take at its next step. Handlers call it before
        they tokenize; submit() checks again."""
        if len(self._queued) + self._checking >= self._limits.max_queued_requests + self._room_in_engine():
            self._rejected += 1
            raise Overloaded(
                f"The server is overloaded: {self._describe_load()}. Please retry after a short wait.",
                self._retry_hint.seconds(),
            )

    @asynccontextmanager
    async def submit(self, request: GenerationRequest) -> AsyncIterator[RequestStream]:
        """Queue `request`; the stream is valid inside the async with-block.

        Raises Overloaded at once if the queue is full (check_capacity), and
        UnsupportedParams for what the engine cannot run (`checked`). Entering waits
        until the loop has taken the request to the engine, so that anything the engine
        refuses (UnsupportedParams) is raised here, before a handler answers 200.
        Leaving the block (normally, by an error, or by cancellation when the client
        goes away) cancels the engine request if it is still running, or takes it out
        of the queue, so no request outlives its handler. Raises NotAccepting once the
        scheduler drains or stops.
        """
        self._check_accepting()
        self._refuse_unsupported(request)
        self.check_capacity()
        checked = await self.checked(request)
        if checked is not request:  # it took a while: ask again
            self._check_accepting()
            self.check_capacity()
            request = checked
        request_id = next(self._ids)
        # Unbounded, so the loop never waits for a consumer; a consumer that lags has
        # its request paused at slow_reader_buffer outputs instead (admission.py).
        send, receive = trio.open_memory_channel[RequestOutput](math.inf)
        active = ActiveRequest(
            request_id=request_id,
            channel=send,
            prompt_tokens=request.prompt_tokens,
            logprobs=self._scores_tokens and request.params.logprobs,
            weight=request.sequences,
            pause_at=self._limits.slow_reader_buffer,
            submitted_at=time.monotonic(),
        )
        admission = Admission(active, request)
        self._queued[request_id] = admission
        self._wake()
        try:
            await admission.added.wait()
            if admission.error is not None:
                raise admission.error
            with receive:
                yield RequestStream(request_id, receive, partial(self._received, active))
        finally:
            self._abort(request_id)

    def _check_accepting(self) -> None:
        if not self._running:
            raise NotAccepting("the scheduler is not running")
        if not self._accepting:
            raise NotAccepting("the scheduler is draining")

    async def checked(self, request: GenerationRequest) -> GenerationRequest:
        """The request as its engine is to run it, or UnsupportedParams for what the
        engine cannot run (`_checked`). Called before the request is queued; while it
        waits it counts toward the queue's bound (Overloaded beyond it, as for submit),
        and NotAccepting once the scheduler stops."""
        self.check_capacity()
        self._checking += 1
        try:
            return await self._checked(request)
        finally:
            self._checking -= 1

    async def _checked(self, request: GenerationRequest) -> GenerationRequest:
        """What `checked` does for this scheduler's engine (the continuous-batching
        scheduler compiles the output constraint: engine_intake.py)."""
        return request

    @asynccontextmanager
    async def reserve(self, places: int) -> AsyncIterator[None]:
        """Hold `places` running places for work done beside the engine (scoring), from
        when the loop admits it, in arrival order with the requests submitted, until the
        block ends. Refused as submit() refuses (Overloaded, NotAccepting)."""
        if not self._running:
            raise NotAccepting("the scheduler is not running")
        if not self._accepting:
            raise NotAccepting("the scheduler is draining")
        self.check_capacity()
        request_id = next(self._ids)
        send, receive = trio.open_memory_channel[RequestOutput](0)
        receive.close()  # nothing is ever sent: a reservation has no output
        active = ActiveRequest(
            request_id=request_id,
            channel=send,
            prompt_tokens=0,
            logprobs=False,
            weight=max(1, places),
            submitted_at=time.monotonic(),
        )
        admission = Admission(active, None)
        self._queued[request_id] = admission
        self._wake()
        try:
            await admission.added.wait()
            yield
        finally:
            self._abort(request_id)
            self._wake()  # its places are free: the loop may admit waiting requests

    def _abort(self, request_id: int, outcome: str | None = "abort") -> None:
        """End a request, running or waiting: cancel its engine requests and close its
        channel. Its choices still unfinished are reported to the observer as ended with
        `outcome` ("abort": its consumer left, "error": the engine failed it), unless it
        never reached the engine (or `outcome` is None: the engine refused it)."""
        active = self._active.pop(request_id, None)
        if active is not None:
            self._left_engine(active, outcome)
            if outcome is not None and active.parts:
                for sequence in active.sequences:
                    if sequence.finish_reason is None:
                        self._observer.ended(outcome)
            self._delivery.forget(active.sequences)
            active.close()
        elif (admission := self._queued.pop(request_id, None)) is not None:
            admission.active.close()
        # Also when the request was in neither: the loop took it from the queue and the
        # engine refused it, and its end may still be the last one a drain waits for.
        if not self.in_flight:
            self._emptied.set()

    def _apply(self, decisions: Decisions) -> None:
        """Carry out what reading and delivering decided (delivery.py): cancel the engine
        requests a stop string ended, then end the requests that are over. Both are safe
        with a step or generation in flight (a handle's cancel() and drop: scheduler.py),
        so the loop applies them at once."""
        for part in decisions.cancels:
            if part.handle is not None:
                part.handle.cancel()  # frees the engine's work at the end of its next step
        for request_id, outcome in decisions.ends.items():
            self._abort(request_id, outcome)

    # ---- draining -----------------------------------------------------------------------

    def drain(self) -> None:
        """Take no new requests (submit raises NotAccepting); those in flight run on."""
        self._accepting = False

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet over, queued ones included (their consumers may
        still be reading)."""
        return len(self._active) + len(self._queued)

    async def idle(self) -> None:
        """Return once no request is in flight. With drain() first, that lasts."""
        while self.in_flight:
            self._emptied = trio.Event()
            await self._emptied.wait()

    def fail_all(self, message: str, code: str = SHUTTING_DOWN, *, waiting: bool = True) -> int:
        """Fail every request in the engine, and with `waiting` those not yet added
        (otherwise they run later): each gets Failed(message, code) and its engine
        request is cancelled. Returns how many were failed. Safe at any time, a step or
        generation in flight included (requests.py)."""
        failed = 0
        for request_id in list(self._active):
            self._active[request_id].send(Failed(message, code))
            self._abort(request_id, "error")
            failed += 1
        if waiting:
            # Waiting submitters find their request failed (its channel holds the reason).
            for request_id, admission in list(self._queued.items()):
                admission.active.send(Failed(message, code))
                self._abort(request_id)
                admission.added.set()
                failed += 1
        return failed

    # ---- slow readers -------------------------------------------------------------------

    def _received(self, active: ActiveRequest) -> None:
        """A consumer took its messages: wake the loop if that resumes its request."""
        if active.paused_at is not None and self._caught_up(active):
            self._wake()

    def _caught_up(self, active: ActiveRequest) -> bool:
        return active.undelivered() <= active.pause_at // 2

    def _resume_or_expire(self, active: ActiveRequest, now: float) -> bool:
        """Resume `active` if it is paused and its consumer has caught up (True), or
        cancel it if it has been paused for longer than the timeout."""
        if active.paused_at is None:
            return False
        if self._caught_up(active):
            active.paused_at = None
            return True
        if now - active.paused_at >= self._limits.slow_reader_timeout:
            self._cancel_slow_reader(active, now)
        return False

    def _cancel_slow_reader(self, active: ActiveRequest, now: float) -> None:
        assert active.paused_at is not None
        log.warning(
            "request %d cancelled: its client read nothing for %.0f s (%d outputs waiting for it, %d tokens generated)",
            active.request_id,
            now - active.paused_at,
            active.undelivered(),
            sum(s.generated for s in active.sequences),
        )
        self._slow_readers_cancelled += 1
        active.send(
            Failed(
                f"The client did not read the stream for {self._limits.slow_reader_timeout:g} s;"
                " the request was cancelled.",
                "slow_reader_timeout",
            )
        )
        self._abort(active.request_id)

    def _pause_deadline(self, active: ActiveRequest) -> float:
        """When `active`'s slow-reader timeout ends (trio time; inf while not paused)."""
        if active.paused_at is None:
            return math.inf
        return active.paused_at + self._limits.slow_reader_timeout

    def _paused(self) -> int:
        """Running requests whose consumers lag (for stats)."""
        return sum(1 for a in self._active.values() if a.paused_at is not None)
