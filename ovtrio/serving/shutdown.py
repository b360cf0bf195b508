"""Graceful shutdown: where the server stands, and the drain.

On SIGTERM or SIGINT the server goes through four phases, with one log line each:

1. draining: readiness answers 503 and new requests are refused with a 503 (code
   `server_shutting_down`, with Retry-After), while the requests in flight run on:
   unary, streamed, and WebSocket responses alike, and embedding, rerank and
   transcription jobs (computing, queued, or between two parts of a large one);
   liveness stays 200. A request still waiting for its model's load (a model loaded on
   demand, ovtrio/serving/residency.py) gets that 503 at once, not its answer once the
   load ends: the drain is there to finish work the engine has begun, and none of that
   request's has; serving it would hold the shutdown for a whole load (seconds for a
   small model, a minute for a large one) before a first token, on a server going away
   whose load balancer already sends new requests elsewhere, where the retry costs the
   same load. No load begins during the drain, and a model whose load ends during it
   takes no request (its scheduler is drained at once);
2. drained, or, once the drain timeout has passed, cut: the requests still running end
   with an error (an error chunk then `[DONE]`, `response.failed`, a WebSocket `error`
   event, a 503 for an encoder's job) and their engine requests are cancelled;
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
from typing import Protocol

import trio

from ovtrio.scheduler import SHUTTING_DOWN

log = logging.getLogger("ovtrio")

# What a request cut by the shutdown is told (the API layer words it for clients).
CUT_MESSAGE = "the server is shutting down"


class Drained(Protocol):
    """What the drain waits for: a generation model's scheduler, or an encoder's jobs
    (ovtrio/embedding/on_demand.py ShutdownDrain)."""

    def drain(self) -> None:
        """Take no new work; what runs runs on."""

    @property
    def in_flight(self) -> int: ...

    async def idle(self) -> None:
        """Return once nothing runs."""

    def fail_all(self, message: str, code: str = SHUTTING_DOWN) -> int:
        """End what still runs with an error; how much."""


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

    async def drain(self, models: Sequence[Drained], cause: str) -> None:
        """Refuse new work, let the requests in flight on every model (each loaded
        model's scheduler, each encoder) run for up to the drain timeout, then cut the
        rest. `cause` names what asked for the shutdown, for the log. A second call
        waits for the first."""
        if self.draining.is_set():
            await self.drained.wait()
            return
        self.draining.set()
        try:
            for model in models:
                model.drain()
            running = sum(model.in_flight for model in models)
            if not running:
                log.info("%s: shutting down; no request in flight, nothing to drain", cause)
                return
            began = trio.current_time()
            log.info(
                "%s: shutting down, draining %d requests (for up to %g s)",
                cause,
                running,
                self.drain_timeout,
            )
            with self._waiting:
                self._waiting.deadline = began + self.drain_timeout
                async with trio.open_nursery() as waiting:
                    for model in models:
                        waiting.start_soon(model.idle)
            waited = trio.current_time() - began
            if any(model.in_flight for model in models):
                why = "timed out" if waited >= self.drain_timeout else "cut short by a second signal"
                cut = sum(model.fail_all(CUT_MESSAGE, SHUTTING_DOWN) for model in models)
                log.warning("drain %s after %.1f s: cut %d requests still running", why, waited, cut)
            else:
                log.info("drained in %.1f s", waited)
        finally:
            self.drained.set()
