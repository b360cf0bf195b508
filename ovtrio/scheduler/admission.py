"""How much work the scheduler takes on, and how long a refused client should wait.

Admission: at most `max_running_sequences` sequences are in the engine at once (each
choice of each prompt is one, as the engine's own max_num_seqs counts them), and at
most `max_queued_requests` requests wait for room behind them, in arrival order. A
request beyond that is refused at once with Overloaded, before the engine sees it, so
a burst costs the server nothing but the refusal and the requests it took on finish in
a bounded time. Without a bound every request of a burst joins the engine's own queue
and all of them wait, none refused (see docs/benchmarks.md#a-burst-of-2000-requests).

Slow readers: a request whose consumer leaves `slow_reader_buffer` outputs unread is
paused (its handle is not read, so its tokens wait in the engine as ids, and nothing is
built for it); once the consumer has read half of them it resumes with nothing lost. A
request paused for `slow_reader_timeout` seconds is cancelled in the engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class AdmissionLimits:
    max_running_sequences: int = 256
    max_queued_requests: int = 512
    slow_reader_buffer: int = 128  # undelivered outputs that pause a request
    slow_reader_timeout: float = 30.0  # seconds paused before it is cancelled


class Overloaded(Exception):
    """The scheduler is full: the request was not taken on. `retry_after` is a hint in
    whole seconds, how long requests have lately waited for room."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RetryHint:
    """A moving average of recent queue times, as the Retry-After of a refusal."""

    def __init__(self, weight: float = 0.2) -> None:
        self._weight = weight
        self._average = 0.0

    def observe(self, queued_seconds: float) -> None:
        self._average += self._weight * (queued_seconds - self._average)

    def seconds(self) -> int:
        return max(1, min(60, math.ceil(self._average)))
