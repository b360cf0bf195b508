"""A lease: what a request holds on a model while it uses it, from the moment the model
is handed to it until its response has ended (a stream's last byte, or its client gone).

A model with a lease out is in use, whatever its scheduler holds: the request may still
be reading its body, tokenizing its prompt or compiling its schema, and submits nothing
yet. So the residency never unloads it as idle or to make room, and an unload asked for
waits for its leases (up to the drain timeout) before it stops taking requests. Ollama's
scheduler counts the same per loaded runner (`server/sched.go`, `runnerRef.refCount`).
A lease given back starts the model's idle time."""

from __future__ import annotations

from collections.abc import Callable

import trio

__all__ = ["Lease", "LeaseCount"]


class LeaseCount:
    """The leases out on one model, and when the last one was given back."""

    def __init__(self) -> None:
        self.held = 0
        self.last_returned = 0.0  # trio's clock
        self._none_held = trio.Event()
        self._none_held.set()

    def take(self, on_return: Callable[[], None] | None = None) -> Lease:
        """A new lease; it must be returned (Lease.release) exactly once, which it
        takes care of itself."""
        self.held += 1
        self._none_held = trio.Event() if self.held == 1 else self._none_held
        return Lease(self, on_return)

    def _returned(self) -> None:
        self.held -= 1
        self.last_returned = trio.current_time()
        if not self.held:
            self._none_held.set()

    async def none_held(self) -> None:
        """Return once no lease is out (at once if none is)."""
        await self._none_held.wait()


class Lease:
    """One request's hold on one model. `release` gives it back; a second call does
    nothing, so whoever ends the request may call it without knowing whether it was."""

    def __init__(self, count: LeaseCount, on_return: Callable[[], None] | None) -> None:
        self._count: LeaseCount | None = count
        self._on_return = on_return

    @property
    def held(self) -> bool:
        return self._count is not None

    def release(self) -> None:
        count, self._count = self._count, None
        if count is None:
            return
        count._returned()
        if self._on_return is not None:
            self._on_return()
