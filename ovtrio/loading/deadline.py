"""How long a model's load may take, and which phase a load that overstays was in.

A load that hangs (a C++ call that never returns, a file that is a pipe nobody writes)
would leave a model "loading" for good, and a server started with it never ready, with
nothing in the log. Each load has a deadline (--load-timeout): past it, the server's
watch (serving/service.py) fails the model with a reason naming the phase it was stuck
in, logs every thread's stack, and `ovtrio serve` exits non-zero once no model is left.

That watch runs on the event loop, which needs the GIL. A hang that holds the GIL
freezes the loop too, so each running load also arms faulthandler's timer, whose
thread needs no GIL: a fixed grace after the deadline it prints every thread's stack
(the frames name the phase) and ends the process with exit status 1.
"""

from __future__ import annotations

import faulthandler
import logging
import sys
import threading
import time
from typing import Any

log = logging.getLogger("ovtrio")

# How long after a load's deadline a frozen process is ended (the watch fails the model
# at the deadline itself when the event loop still runs).
FROZEN_GRACE = 30.0

_lock = threading.Lock()
_armed: dict[int, float] = {}  # id(LoadProgress) -> when faulthandler ends the process


class LoadProgress:
    """Where a load is: queued, then in one named phase after another, then ended.
    Phases are set by the loading thread and read by the watch."""

    def __init__(self, name: str, timeout: float | None) -> None:
        self.name = name
        self.timeout = timeout if timeout else None  # None: no deadline
        self.queued = time.monotonic()
        self.started: float | None = None
        self.phase = "waiting for the loads before it"
        self.phase_since = self.queued
        self.ended = False

    def enter(self, phase: str) -> None:
        """The load is now in `phase` (its first call starts the load's clock)."""
        now = time.monotonic()
        if self.started is None:
            self.started = now
            _arm(self)
        self.phase, self.phase_since = phase, now

    def end(self) -> None:
        """The load ended (loaded or failed), or is given up on: nothing ends the
        process for it any more."""
        self.ended = True
        _disarm(self)

    def deadline(self) -> float | None:
        """When the load is overdue (time.monotonic()): its timeout from when it began,
        or from when it was queued while it waits for loads before it; None without one."""
        if self.timeout is None:
            return None
        return (self.started if self.started is not None else self.queued) + self.timeout

    def overdue_reason(self) -> str:
        """What a load past its deadline is failed with: the phase it was stuck in."""
        stuck = time.monotonic() - self.phase_since
        return (
            f"model {self.name} did not load within {self.timeout:g} s (--load-timeout): its load hung in the"
            f" {self.phase} phase ({stuck:.0f} s in it); the server's threads' stacks are in its log"
        )


def dump_stacks() -> None:
    """Every thread's stack on stderr (where the log goes), for a load that overstayed."""
    stderr = _stderr()
    if stderr is not None:
        faulthandler.dump_traceback(file=stderr, all_threads=True)


def _stderr() -> Any:
    """The process's stderr as faulthandler writes it (a file with a descriptor: under a
    test runner that captures sys.stderr, the one the process started with)."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None:
                stream.fileno()
                return stream
        except (AttributeError, OSError, ValueError):
            continue
    return None


def _arm(progress: LoadProgress) -> None:
    if progress.timeout is None:
        return
    with _lock:
        _armed[id(progress)] = time.monotonic() + progress.timeout + FROZEN_GRACE
        _rearm()


def _disarm(progress: LoadProgress) -> None:
    with _lock:
        if _armed.pop(id(progress), None) is not None:
            _rearm()


def _rearm() -> None:
    """faulthandler's one timer, for the earliest armed load (under _lock)."""
    faulthandler.cancel_dump_traceback_later()
    stderr = _stderr()
    if _armed and stderr is not None:
        seconds = max(1.0, min(_armed.values()) - time.monotonic())
        faulthandler.dump_traceback_later(seconds, exit=True, file=stderr)
