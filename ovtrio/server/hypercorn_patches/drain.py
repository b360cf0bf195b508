"""Under the `hypercorn` command, drain while Hypercorn still listens, as `ovtrio serve` does.

Hypercorn's main process takes the signals (SIGTERM, SIGINT, and SIGHUP for a reload)
and sets an event that its worker polls: `trio_worker` (hypercorn/trio/run.py) hands
`worker_serve` the poll, `check_multiprocess_shutdown_event`, as its shutdown trigger,
and once the trigger returns the worker stops listening, and after `graceful_timeout`
cancels whatever still runs. Nothing runs in between, and Hypercorn offers an app no
hook there: the app hears of the shutdown only in its lifespan shutdown, after every
connection has ended. Left so, new connections are refused instead of answered 503,
readiness never says `draining`, and every stream is cut mid-body at the graceful
timeout, with no error chunk and no `[DONE]`.

`apply(drain)` replaces that trigger, the name `check_multiprocess_shutdown_event` in
hypercorn.trio.run, with one that waits for the same event and then awaits `drain()`
before it returns: the drain (ovtrio/serving/shutdown.py) runs while the worker still listens,
as under `ovtrio serve`. `trio_worker` looks the name up after it has imported the app
(`load_application`), so ovtrio.app applies this at import. A second signal cannot cut
the drain short here (Hypercorn's main process only sets the event again): the drain
timeout bounds it. It only patches the exact code it was written for (Hypercorn 0.18.0's
`trio_worker` and trigger, identified by hashes of their source): any other version is
left alone, with a warning.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
from collections.abc import Awaitable, Callable
from importlib import metadata
from typing import Any

log = logging.getLogger("ovtrio")

# What the drain's log line gives as its cause: the worker is not told which signal came.
CAUSE = "hypercorn shutdown"

# sha256 of inspect.getsource() in Hypercorn 0.18.0 of the code the patch relies on: the
# trigger it wraps, and the worker that looks the trigger up after importing the app.
PATCHED_SOURCES = {
    "hypercorn.utils.check_multiprocess_shutdown_event": (
        "7c275f68b1ec59b7d529ac570e9d0a3000329d9908fbbaff10481e389089bbf7"
    ),
    "hypercorn.trio.run.trio_worker": "93848f30a88b81756a00e7d37f2f2c76677701f9a61fdf69e9e76b0701a8fb42",
}

_applied = False


def apply(drain: Callable[[str], Awaitable[None]]) -> bool:
    """Have Hypercorn's trio worker await `drain(CAUSE)` between the shutdown signal and
    closing its listeners, once per process; True if it is patched."""
    global _applied
    if _applied:
        return True
    import hypercorn.trio.run as trio_run
    from hypercorn import utils

    found: dict[str, Callable[..., Any]] = {
        "hypercorn.utils.check_multiprocess_shutdown_event": utils.check_multiprocess_shutdown_event,
        "hypercorn.trio.run.trio_worker": trio_run.trio_worker,
    }
    changed = [
        name
        for name, code in found.items()
        if hashlib.sha256(inspect.getsource(code).encode()).hexdigest() != PATCHED_SOURCES[name]
    ]
    if changed or trio_run.check_multiprocess_shutdown_event is not utils.check_multiprocess_shutdown_event:
        log.warning(
            "hypercorn %s: %s is not the code ovtrio's drain was written for; under the hypercorn command,"
            " a shutdown will not drain",
            metadata.version("hypercorn"),
            " and ".join(changed) or "hypercorn.trio.run's shutdown trigger",
        )
        return False
    original = utils.check_multiprocess_shutdown_event

    async def drain_then_shut_down(shutdown_event: Any, sleep: Callable[[float], Awaitable[Any]]) -> None:
        await original(shutdown_event, sleep)
        await drain(CAUSE)

    trio_run.check_multiprocess_shutdown_event = drain_then_shut_down
    _applied = True
    return True
