"""Graceful shutdown: where the server stands, and the drain.

On SIGTERM or SIGINT the server goes through four phases, with one log line each:

1. draining: readiness answers 503 and new generation requests are refused with a 503
   (code `server_shutting_down`, with Retry-After), while the requests in flight run on:
   unary, streamed, and WebSocket responses alike; liveness stays 200;
2. drained, or, once the drain timeout has passed, cut: the requests still running end
   with an error (an error chunk then `[DONE]`, `response.failed`, a WebSocket `error`
   event) and their engine requests are cancelled;
3. engine released: each model's scheduler loop stops and its pipeline is let go
   (ModelRegistry.close, from the app's lifespan shutdown);
4. exit, with code 0 (the launcher).

Why the drain belongs to the launcher and the release to the app: late requests should
get a 503 that says what is going on, not a refused connection, so the drain has to run
while the server still listens; only the launcher can arrange that (`ovtrio serve`
drains inside Hypercorn's shutdown trigger, before Hypercorn closes its listeners, and
under the hypercorn command ovtrio/server/hypercorn_patches/drain.py has Hypercorn's worker do the
same). The engine may go only once no handler can reach it any more, which is when
Hypercorn runs the app's lifespan shutdown.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import trio

from ovtrio.scheduler import SHUTTING_DOWN, GenerationScheduler

log = logging.getLogger("ovtrio")

# What a request cut by the shutdown is told (the API layer words it for clients).
CUT_MESSAGE = "the server is shutting down"


class Shutdown:
    """The server's shutdown state, shared by the launcher, the probes and the routes."""

    def __init__(self, drain_timeout: float) -> None:
        self.drain_timeout = drain_timeout
        # Set when the drain begins: readiness turns 503, new work is refused.
        self.draining = trio.Event()
        # Set when the drain is over: what was in flight has finished or been cut.
        # WebSockets close then; the launcher stops listening.
        self.drained = trio.Event()
        self._waiting = trio.CancelScope()

    def hurry(self) -> None:
        """End the drain now and cut what still runs (a second signal asks for this)."""
        self._waiting.cancel()

    async def drain(self, schedulers: Sequence[GenerationScheduler], cause: str) -> None:
        """Refuse new work, let the requests in flight on every scheduler (one per model
        loaded so far) run for up to the drain timeout, then cut the rest. `cause` names
        what asked for the shutdown, for the log. A second call waits for the first."""
        if self.draining.is_set():
            await self.drained.wait()
            return
        self.draining.set()
        try:
            if not schedulers:
                log.info("%s: shutting down; no model loaded yet, nothing to drain", cause)
                return
            for scheduler in schedulers:
                scheduler.drain()
            began = trio.current_time()
            log.info(
                "%s: shutting down, draining %d requests (for up to %g s)",
                cause,
                sum(scheduler.in_flight for scheduler in schedulers),
                self.drain_timeout,
            )
            with self._waiting:
                self._waiting.deadline = began + self.drain_timeout
                async with trio.open_nursery() as waiting:
                    for scheduler in schedulers:
                        waiting.start_soon(scheduler.idle)
            waited = trio.current_time() - began
            if any(scheduler.in_flight for scheduler in schedulers):
                why = "timed out" if waited >= self.drain_timeout else "cut short by a second signal"
                cut = sum(scheduler.fail_all(CUT_MESSAGE, SHUTTING_DOWN) for scheduler in schedulers)
                log.warning("drain %s after %.1f s: cut %d requests still running", why, waited, cut)
            else:
                log.info("drained in %.1f s", waited)
        finally:
            self.drained.set()
