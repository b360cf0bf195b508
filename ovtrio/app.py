"""The ASGI entry point: `hypercorn -k trio --config python:ovtrio.server.hypercorn_config
ovtrio.app:app` serves the app configured from OVTRIO_* environment variables; `ovtrio
serve` builds the same app from flags (ovtrio/server/app.py)."""

from __future__ import annotations

from typing import Any

import trio
from quart_trio import QuartTrio

from ovtrio import seams
from ovtrio.api import context
from ovtrio.server.app import create_app, exit_with_error
from ovtrio.server.hypercorn_patches import drain
from ovtrio.settings.server import SettingsError

__all__ = ["app", "create_app"]


class _LazyApp:
    """Builds the app on first use, so importing ovtrio.app has no side effects beyond
    reading the environment when a server actually starts (and the drain patch)."""

    _app: QuartTrio | None = None

    async def drain(self, cause: str) -> None:
        """Drain the app's requests in flight, if it has been built (ovtrio/serving/shutdown.py)."""
        if self._app is not None:
            await context.registry_of(self._app).drain(cause)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            _require_trio()
            try:
                self._app = create_app()
            except SettingsError as exc:
                exit_with_error(exc)
        await self._app(scope, receive, send)


def _require_trio() -> None:
    """End the process with a one-line reason when a server runs the app on another event
    loop (plain `hypercorn ovtrio.app:app` picks asyncio): Hypercorn would only log a
    lifespan warning and go on serving, each request failing inside Quart-Trio with a
    traceback and never answered. The first call is the lifespan startup, before any
    connection is accepted."""
    try:
        trio.lowlevel.current_trio_token()
    except RuntimeError:
        exit_with_error(
            RuntimeError(
                "ovtrio runs on Trio: start it with `hypercorn -k trio ovtrio.app:app` "
                "(or with `--config python:ovtrio.server.hypercorn_config`, which sets it)"
            )
        )


app = _LazyApp()
# Hypercorn's worker builds its shutdown trigger right after importing this module, and
# only a patch applied now makes it drain first (see ovtrio/server/hypercorn_patches/drain.py).
seams.record(
    "drain under the hypercorn command",
    "hypercorn",
    drain.apply(app.drain),
    "a shutdown under the hypercorn command refuses new connections at once and cuts streams",
)
