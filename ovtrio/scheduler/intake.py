"""What both schedulers keep of the requests they take on, whichever way they run them.

A request is submitted, waits in a queue (arrival order) until the loop takes it to the
engine, runs there, and ends: finished, left by its consumer, failed, or cancelled
because its consumer stopped reading. RequestIntake holds that bookkeeping: the queue
and the running requests, submit() and its refusals (NotAccepting, Overloaded), the
end of a request (`abort`), draining, the slow-reader pause and timeout (admission.py
says why), fail_all() and the counters that go with them.

What differs is asked of the scheduler that runs the requests, its EngineSide: how much
room its engine has, which requests it can run at all, what it makes of a request
before queueing it, what it frees when a running request ends, and how to get its
loop's attention. Its loop takes the queued requests to the engine: the
continuous-batching Scheduler (scheduler.py, which admits through engine_admission.py)
or the one-at-a-time StatefulScheduler (stateful.py).
"""

from __future__ import annotations

import itertools
import logging
import math
import time
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Protocol

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


class EngineSide(Protocol):
    """What the intake asks of the scheduler whose loop runs its requests."""

    def room(self) -> int:
        """Requests the engine can take at once, beyond those queued for it."""
        ...

    def load(self) -> str:
        """What runs and waits, for the Overloaded message."""
        ...

    def refuse_unsupported(self, request: GenerationRequest) -> None:
        """Raise UnsupportedParams for a request the engine cannot run at all."""
        ...

    async def prepared(self, request: GenerationRequest) -> GenerationRequest:
        """The request as the engine is to run it (or UnsupportedParams), before it is
        queued (the continuous-batching engine compiles its output constraint)."""
        ...

    def left(self, active: ActiveRequest, outcome: str | None) -> None:
        """A running request has ended (called before its channel closes), with the
        outcome `abort` reports for its unfinished choices."""
        ...

    def wanted(self) -> None:
        """The loop has work between engine steps (a request to add, one to resume):
        a scheduler whose engine runs on by itself hands it back to the loop."""
        ...


class RequestIntake:
    """The requests a scheduler has taken on, from submit() to their end. The scheduler's
    loop moves them from `queued` to `active` (ending each with `abort`) and sets
    `running` while it runs."""

    def __init__(
        self,
        engine: EngineSide,
        tokenizer: Any,
        vocabulary: Any,
        stream_interval: int,
        limits: AdmissionLimits,
        observer: RequestObserver | None,
        *,
        scores_tokens: bool = True,
        vocabulary_size: int | None = None,
    ) -> None:
        """`scores_tokens`: whether the engine's outputs carry log-probabilities to pass on.
        `vocabulary_size`: see Delivery."""
        # Weakly: the scheduler holds its intake, and a strong reference back would be a
        # cycle that only a full collection frees, the model's pipeline with it (a pause
        # of the event loop at each unload, ovtrio/serving/service.py).
        self._engine = weakref.proxy(engine)
        self._scores_tokens = scores_tokens
        self.limits = limits
        # Requests in the engine, and those waiting for room there (in arrival order).
        self.active: dict[int, ActiveRequest] = {}
        self.queued: dict[int, Admission] = {}
        # Requests waiting for their output constraint to be checked (`checked`): they
        # wait as queued ones do, and count as such toward the queue's bound, so a flood
        # of new constraints is refused as any other is, not left to wait without end.
        self._checking = 0
        self.observer = observer or NoObserver()
        self.retry_hint = RetryHint()
        self.rejected = 0
        self.slow_readers_cancelled = 0
        self.prompt_tokens = 0  # of the requests added to the engine (the loop counts them)
        self.delivery = Delivery(tokenizer, vocabulary, stream_interval, self.active, self.observer, vocabulary_size)
        self._ids = itertools.count(1)
        # Set to wake the loop: a request arrived, a consumer caught up, ...
        self._work = trio.Event()
        self.running = False
        self._accepting = True
        # Set whenever the last request in flight leaves; a fresh one per wait (idle()).
        self._emptied = trio.Event()

    def next_id(self) -> int:
        """A fresh id: of a request, or of an engine request (the engine's own ids)."""
        return next(self._ids)

    @property
    def waiting(self) -> int:
        """Requests queued for the engine, those whose constraint is being checked included."""
        return len(self.queued) + self._checking

    def wake(self) -> None:
        """Wake the loop: work has come (`wait_for_work`), and the engine is wanted."""
        self._work.set()
        self._engine.wanted()

    async def wait_for_work(self, deadline: float = math.inf) -> None:
        """Sleep until `wake` (since the last wait), or until `deadline` (trio time)."""
        with trio.move_on_at(deadline):
            await self._work.wait()
        self._work = trio.Event()

    # ---- submission side (called from request handlers) --------------------------------

    def check_capacity(self) -> None:
        """Raise Overloaded if a request submitted now would be refused: the queue is
        full beyond what the engine can take at its next step. Handlers call it before
        they tokenize; submit() checks again."""
        if self.waiting >= self.limits.max_queued_requests + self._engine.room():
            self.rejected += 1
            raise Overloaded(
                f"The server is overloaded: {self._engine.load()}. Please retry after a short wait.",
                self.retry_hint.seconds(),
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
        self._engine.refuse_unsupported(request)
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
            pause_at=self.limits.slow_reader_buffer,
            submitted_at=time.monotonic(),
        )
        admission = Admission(active, request)
        self.queued[request_id] = admission
        self.wake()
        try:
            await admission.added.wait()
            if admission.error is not None:
                raise admission.error
            with receive:
                yield RequestStream(request_id, receive, partial(self._received, active))
        finally:
            self.abort(request_id)

    def _check_accepting(self) -> None:
        if not self.running:
            raise NotAccepting("the scheduler is not running")
        if not self._accepting:
            raise NotAccepting("the scheduler is draining")

    async def checked(self, request: GenerationRequest) -> GenerationRequest:
        """The request as its engine is to run it, or UnsupportedParams for what the
        engine cannot run (EngineSide.prepared). Called before the request is queued; while it
        waits it counts toward the queue's bound (Overloaded beyond it, as for submit),
        and NotAccepting once the scheduler stops."""
        self.check_capacity()
        self._checking += 1
        try:
            return await self._engine.prepared(request)
        finally:
            self._checking -= 1

    @asynccontextmanager
    async def reserve(self, places: int) -> AsyncIterator[None]:
        """Hold `places` running places for work done beside the engine (scoring), from
        when the loop admits it, in arrival order with the requests submitted, until the
        block ends. Refused as submit() refuses (Overloaded, NotAccepting)."""
        if not self.running:
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
        self.queued[request_id] = admission
        self.wake()
        try:
            await admission.added.wait()
            yield
        finally:
            self.abort(request_id)
            self.wake()  # its places are free: the loop may admit waiting requests

    def abort(self, request_id: int, outcome: str | None = "abort") -> None:
        """End a request, running or waiting: cancel its engine requests and close its
        channel. Its choices still unfinished are reported to the observer as ended with
        `outcome` ("abort": its consumer left, "error": the engine failed it), unless it
        never reached the engine (or `outcome` is None: the engine refused it)."""
        active = self.active.pop(request_id, None)
        if active is not None:
            self._engine.left(active, outcome)
            if outcome is not None and active.parts:
                for sequence in active.sequences:
                    if sequence.finish_reason is None:
                        self.observer.ended(outcome)
            self.delivery.forget(active.sequences)
            active.close()
        elif (admission := self.queued.pop(request_id, None)) is not None:
            admission.active.close()
        # Also when the request was in neither: the loop took it from the queue and the
        # engine refused it, and its end may still be the last one a drain waits for.
        if not self.in_flight:
            self._emptied.set()

    def apply(self, decisions: Decisions) -> None:
        """Carry out what reading and delivering decided (delivery.py): cancel the engine
        requests a stop string ended, then end the requests that are over. Both are safe
        with a step or generation in flight (a handle's cancel() and drop: scheduler.py),
        so the loop applies them at once."""
        for part in decisions.cancels:
            if part.handle is not None:
                part.handle.cancel()  # frees the engine's work at the end of its next step
        for request_id, outcome in decisions.ends.items():
            self.abort(request_id, outcome)

    # ---- draining -----------------------------------------------------------------------

    def drain(self) -> None:
        """Take no new requests (submit raises NotAccepting); those in flight run on."""
        self._accepting = False

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet over, queued ones included (their consumers may
        still be reading)."""
        return len(self.active) + len(self.queued)

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
        for request_id in list(self.active):
            self.active[request_id].send(Failed(message, code))
            self.abort(request_id, "error")
            failed += 1
        if waiting:
            # Waiting submitters find their request failed (its channel holds the reason).
            for request_id, admission in list(self.queued.items()):
                admission.active.send(Failed(message, code))
                self.abort(request_id)
                admission.added.set()
                failed += 1
        return failed

    # ---- slow readers -------------------------------------------------------------------

    def _received(self, active: ActiveRequest) -> None:
        """A consumer took its outputs: wake the loop if that resumes its request."""
        if active.paused_at is not None and self._caught_up(active):
            self.wake()

    def _caught_up(self, active: ActiveRequest) -> bool:
        return active.undelivered() <= active.pause_at // 2

    def resume_or_expire(self, active: ActiveRequest, now: float) -> bool:
        """Resume `active` if it is paused and its consumer has caught up (True), or
        cancel it if it has been paused for longer than the timeout."""
        if active.paused_at is None:
            return False
        if self._caught_up(active):
            active.paused_at = None
            return True
        if now - active.paused_at >= self.limits.slow_reader_timeout:
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
        self.slow_readers_cancelled += 1
        active.send(
            Failed(
                f"The client did not read the stream for {self.limits.slow_reader_timeout:g} s;"
                " the request was cancelled.",
                "slow_reader_timeout",
            )
        )
        self.abort(active.request_id)

    def pause_deadline(self, active: ActiveRequest) -> float:
        """When `active`'s slow-reader timeout ends (trio time; inf while not paused)."""
        if active.paused_at is None:
            return math.inf
        return active.paused_at + self.limits.slow_reader_timeout

    def paused(self) -> int:
        """Running requests whose consumers lag (for stats)."""
        return sum(1 for a in self.active.values() if a.paused_at is not None)

    def next_pause_deadline(self) -> float:
        """When the first paused request's slow-reader timeout ends (trio time)."""
        return min((self.pause_deadline(a) for a in self.active.values()), default=math.inf)
