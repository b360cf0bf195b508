"""One worker per encoder: a bounded queue of jobs, batched, run in one thread.

The pipeline cannot run in two threads at once but releases the GIL while it
computes, so each model has one task that takes the jobs waiting in its queue and runs
them, together, in a worker thread (`trio.to_thread` with a limiter of one): the event
loop never waits for the model. Jobs that arrive while a batch runs wait and go
together into the next, up to `max_batch` inputs: a batch computes many more vectors
a second than as many batches of one (see docs/benchmarks.md#the-embedding-model).

Admission follows the generation scheduler's rules (scheduler/admission.py): at most
`max_queued` jobs wait; one beyond them is refused at once with Overloaded, whose
retry hint is the recent queue time. A job whose client left before its batch started
is dropped from the batch: it costs nothing.

A job of more inputs than a batch holds is computed a batch at a time: after each part,
it goes back to the end of the queue, so a request that comes meanwhile waits for one
part, not for the whole of a large request, and a large request whose client left stops
at the end of its current part.

Clients that send one text at a time send their next request once their reply comes:
when a batch ends, its clients are still reading their replies, and a worker that took
only what had arrived by then ran small batches, and this wait makes them larger (see
docs/benchmarks.md#the-embedding-model). So when fewer inputs wait than the last batch
had, the worker waits for more, up to half the last batch's time and at most
`GATHER_SECONDS`: a lone client (last batch of one) never waits.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import trio

from ovtrio.scheduler.admission import Overloaded, RetryHint

Model = TypeVar("Model")

GATHER_SECONDS = 0.05


class EncoderUnavailable(Exception):
    """The encoder cannot run jobs: it failed to load, found no room to load, or the
    server is stopping. `code` is machine-readable ("model_unavailable",
    "shutting_down"); `retry_after`, when set, the seconds after which a retry may do."""

    def __init__(self, message: str, code: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.retry_after = retry_after


@dataclass(eq=False)
class Job:
    """One request's work: `payload` for the model, `size` inputs; the thread sets
    `result` or `error`, and `tokens`. A job computed in parts keeps its own state in
    `progress`, `left` inputs still to compute, and sets `more` while some are."""

    payload: Any
    size: int
    result: Any = None
    error: BaseException | None = None
    tokens: int = 0
    abandoned: bool = False
    progress: Any = None
    more: bool = False
    left: int = -1
    queued_at: float = field(default_factory=time.monotonic)
    done: trio.Event = field(default_factory=trio.Event)


class EncoderObserver:
    """What a worker reports of its requests and batches (the metrics); does nothing."""

    def finished(self, inputs: int, tokens: int) -> None: ...

    def batch(self, inputs: int) -> None: ...

    def rejected(self) -> None: ...

    def first_audio(self, pieces: int) -> None:
        """A speech request's first audio left after `pieces` of its pieces were spoken."""


@dataclass(frozen=True)
class WorkerStats:
    queued: int
    running: int
    rejected: int


class EncoderWorker(Generic[Model]):
    def __init__(
        self,
        run_batch: Callable[[Model, Sequence[Job]], None],
        max_batch: int,
        max_queued: int,
        observer: EncoderObserver | None = None,
        batch_jobs: bool = True,
    ) -> None:
        """`run_batch(model, jobs)` computes the jobs in the worker thread, setting each
        one's result or error. `batch_jobs`: whether several jobs may share a batch."""
        self._run_batch = run_batch
        self._max_batch = max_batch
        self._max_queued = max_queued
        self._batch_jobs = batch_jobs
        self._observer = observer or EncoderObserver()
        self._queue: deque[Job] = deque()
        self._wakeup = trio.Event()
        self._retry = RetryHint()
        self._running = 0
        self._rejected = 0
        self._closed: EncoderUnavailable | None = None
        self._thread = trio.CapacityLimiter(1)
        self._last_inputs = 0
        self._last_seconds = 0.0
        self._batch_started = False  # whether the current batch's thread has begun
        self._batch: Sequence[Job] = ()  # the jobs the thread computes now

    def stats(self) -> WorkerStats:
        return WorkerStats(queued=self._waiting_jobs(), running=self._running, rejected=self._rejected)

    @property
    def has_work(self) -> bool:
        """Whether a job is computing or waiting: a job between two of its parts counts,
        though it holds no place of the queue (stats().queued leaves it out)."""
        return bool(self._running) or any(not job.abandoned for job in self._queue)

    @property
    def jobs(self) -> int:
        """The jobs computing or waiting (has_work's, counted): what a drain waits for."""
        return self._running + sum(1 for job in self._queue if not job.abandoned)

    async def submit(self, job: Job) -> Job:
        """Queue `job` and wait for it to be computed. Raises Overloaded when the queue
        is full, EncoderUnavailable when the worker is closed. Cancelled (the client
        left), the job is dropped if its batch has not started."""
        return await self.wait(self.enqueue(job))

    def enqueue(self, job: Job) -> Job:
        """Queue `job` (admission as `submit`'s), for `wait` later: a streamed request is
        admitted before its response starts and waited for while it is written."""
        if self._closed is not None:
            raise self._closed
        waiting = self._waiting_jobs()
        if waiting >= self._max_queued:
            raise self.refusal(waiting)
        self._queue.append(job)
        self._wakeup.set()
        return job

    def room(self) -> int:
        """How many more jobs could be taken now: the queue's free places, and the
        thread when it computes nothing (the next job starts at once, holding no place)."""
        return self._max_queued - self._waiting_jobs() + (0 if self._running else 1)

    def refusal(self, waiting: int) -> Overloaded:
        """The Overloaded refusing a request that found `waiting` requests ahead of it
        (counted as rejected), with the recent queue time as its retry hint."""
        self._rejected += 1
        self._observer.rejected()
        return Overloaded(f"The server has {waiting} requests waiting for this model; retry later.", self.retry_after())

    def retry_after(self) -> int:
        """Whole seconds a refused request had best wait: how long jobs lately waited."""
        return self._retry.seconds()

    async def wait(self, job: Job) -> Job:
        """`job` once computed (its error raised). Cancelled (the client left), the job
        is dropped if its batch has not started, and stops after its current part if it
        has."""
        try:
            await job.done.wait()
        finally:
            if not job.done.is_set():
                job.abandoned = True
        if job.error is not None:
            raise job.error
        self._observer.finished(job.size, job.tokens)
        return job

    def close(self, reason: EncoderUnavailable) -> None:
        """Refuse new jobs and fail those waiting with `reason`."""
        self._closed = reason
        self.fail_queued(reason)

    def cut(self, reason: EncoderUnavailable) -> int:
        """Close with `reason` (close) and end the jobs in the thread with it too, without
        waiting for their batch (its result is dropped): the end of a drain. How many
        jobs were ended."""
        ended = [job for job in self._queue if not job.abandoned and not job.done.is_set()]
        ended += [job for job in self._batch if not job.abandoned and not job.done.is_set() and job not in ended]
        self.close(reason)
        for job in ended:
            job.error = reason
            job.done.set()
        return len(ended)

    def fail_queued(self, reason: EncoderUnavailable) -> None:
        """Fail the jobs waiting with `reason` (new ones are still taken)."""
        while self._queue:
            job = self._queue.popleft()
            job.error = reason
            job.done.set()

    def reopen(self) -> None:
        """Take jobs again after a close (the model is to be loaded once more)."""
        self._closed = None

    def _next_batch(self) -> list[Job]:
        batch: list[Job] = []
        inputs = 0
        while self._queue:
            job = self._queue[0]
            if job.abandoned:
                self._queue.popleft()
                continue
            part = self.part_of(job)
            if batch and (not self._batch_jobs or inputs + part > self._max_batch):
                break
            self._queue.popleft()
            batch.append(job)
            inputs += part
        return batch

    def _waiting_jobs(self) -> int:
        """Jobs queued that have not started: those back in the queue for their next part
        hold no place of `max_queued`, as a job in the thread does not."""
        return sum(1 for job in self._queue if job.left < 0)

    def part_of(self, job: Job) -> int:
        """The inputs of `job` its next batch takes: all it has left, up to a batch."""
        return min(job.size if job.left < 0 else job.left, self._max_batch)

    def _waiting_inputs(self) -> int:
        return sum(self.part_of(job) for job in self._queue if not job.abandoned)

    async def _gather(self) -> None:
        """Wait a little for the clients of the last batch to come back (see above)."""
        if not self._batch_jobs:
            return
        wanted = min(self._last_inputs, self._max_batch)
        with trio.move_on_after(min(GATHER_SECONDS, self._last_seconds / 2)):
            while self._waiting_inputs() < wanted:
                self._wakeup = trio.Event()
                await self._wakeup.wait()

    async def run(self, model: Model) -> None:
        """Compute queued jobs until cancelled; a batch in the thread is waited for."""
        while True:
            if not self._queue:
                self._wakeup = trio.Event()
                await self._wakeup.wait()
            await self._gather()
            batch = self._next_batch()
            if not batch:
                continue
            now = time.monotonic()
            for job in batch:
                self._retry.observe(now - job.queued_at)
            self._running = len(batch)
            parts = [self.part_of(job) for job in batch]
            self._last_inputs = sum(parts)
            started = time.monotonic()
            self._batch_started = False
            self._batch = batch
            try:
                await trio.to_thread.run_sync(self._compute, model, batch, limiter=self._thread)
            finally:
                self._last_seconds = time.monotonic() - started
                self._running = 0
                self._batch = ()
                if not self._batch_started:
                    # Cancelled (the model unloads, or the server stops) before the
                    # thread began: nothing of the batch was computed. Its jobs go back
                    # to the front of the queue, for the next load, or hear why not.
                    self._requeue(batch)
                    batch = []
                # The batch as computed: a job refused on its first turn (an input over a
                # limit) had none of its inputs computed.
                computed = sum(part for part, job in zip(parts, batch) if job.error is None)
                if computed:
                    self._observer.batch(computed)
                for job in batch:
                    if job.more and job.error is None and not job.abandoned:
                        if self._closed is None:
                            self._queue.append(job)  # its next part waits behind what came meanwhile
                            continue
                        job.error = self._closed
                    job.done.set()

    def _requeue(self, batch: Sequence[Job]) -> None:
        for job in reversed(batch):
            if self._closed is not None:
                job.error = self._closed
                job.done.set()
            else:
                self._queue.appendleft(job)

    def _compute(self, model: Model, batch: Sequence[Job]) -> None:
        self._batch_started = True
        for job in batch:
            job.more = False
        try:
            self._run_batch(model, batch)
        except Exception as exc:  # noqa: BLE001 (the engine failed: every job of the batch gets it)
            for job in batch:
                if job.error is None and job.result is None:
                    job.error = exc
