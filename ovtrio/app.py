"""The Quart-Trio application. `hypercorn -k trio ovtrio.app:app` serves it configured
from OVTRIO_* environment variables; `ovtrio serve` builds the same app from flags."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, NoReturn

import trio
from quart import Response
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, MethodNotAllowed, RequestEntityTooLarge

from ovtrio import closing, memory
from ovtrio.api import auth, context, health, metrics, models, tokenize
from ovtrio.api.chat import routes as chat
from ovtrio.api.completions import routes as completions
from ovtrio.api.errors import api_error, error_response
from ovtrio.api.responses import routes as responses
from ovtrio.api.responses import socket as responses_socket
from ovtrio.api.responses.store import ResponseStore
from ovtrio.config import Settings, SettingsError, api_keys, settings_from_env
from ovtrio.config_file import model_settings
from ovtrio.logs import configure_logging
from ovtrio.metrics import ServerMetrics
from ovtrio.model import LoadedModel, ModelLoadError
from ovtrio.registry import ModelRegistry

log = logging.getLogger("ovtrio")


def create_app(
    settings: Settings | None = None, loading: Sequence[Future[tuple[LoadedModel, int]]] | None = None
) -> QuartTrio:
    """The app for `settings` (default: from the environment), serving the model they
    name or those of their config file; `loading`, when given, is each model's load
    already under way (ovtrio.model.start_loading_in_order). Raises SettingsError."""
    settings = settings or settings_from_env()
    each_model = model_settings(settings)
    configure_logging(settings.log_level)
    closing.apply()
    app = QuartTrio("ovtrio")
    # Streams may run for minutes: no response timeout; request bodies are small.
    app.config["RESPONSE_TIMEOUT"] = None
    app.config["BODY_TIMEOUT"] = 60
    # A body over the limit is refused (413) before it is read when its Content-Length
    # says so, and as soon as it passes the limit otherwise.
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    server_metrics = ServerMetrics()
    registry = ModelRegistry(each_model, settings.drain_timeout, observer=server_metrics.for_model, loading=loading)
    store = ResponseStore(
        settings.response_store_size,
        settings.response_store_ttl,
        settings.response_store_path,
        max_bytes=settings.response_store_bytes,
    )
    context.attach(app, registry, store, metrics.registry_for(registry, server_metrics, store))
    metrics.install(app, server_metrics)
    auth.install(app, auth.KeyCheck(api_keys(settings), settings.protect_metrics))
    for module in (completions, chat, responses, responses_socket, models, tokenize, health, metrics):
        app.register_blueprint(module.blueprint)

    trimming: list[trio.CancelScope] = []  # the task that returns free memory, ended at shutdown

    @app.before_serving
    async def start_models() -> None:
        try:
            registry.check()
        except ModelLoadError as exc:
            # One line and a non-zero exit, not the lifespan machinery's nested
            # traceback; there is nothing to clean up yet.
            _exit_with(exc)
        await app.nursery.start(registry.run)
        trimming.append(await app.nursery.start(memory.trim_periodically))

    @app.after_serving
    async def release_models() -> None:
        # Hypercorn runs this once every connection has ended. Under `ovtrio serve` the
        # drain is over by then (the launcher ran it while still listening); under a bare
        # `hypercorn` this is the first the app hears of the shutdown, and the drain finds
        # nothing left in flight. Either way nothing can reach the engine any more.
        await registry.drain("hypercorn stopping")
        await registry.close()
        for scope in trimming:
            scope.cancel()

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException) -> Response:
        if isinstance(error, RequestEntityTooLarge):
            error = RequestEntityTooLarge(
                f"The request body is larger than the {settings.max_body_bytes} bytes this server accepts"
                " (--max-body-bytes)."
            )
        response = error_response(api_error(error))
        # A 405 must say which methods the route does allow (RFC 9110, 15.5.6).
        if isinstance(error, MethodNotAllowed) and error.valid_methods:
            response.headers["Allow"] = ", ".join(error.valid_methods)
        return response

    @app.errorhandler(Exception)
    async def request_error(error: Exception) -> Response:
        return error_response(api_error(error))

    return app


def _exit_with(error: Exception) -> NoReturn:
    log.error("%s", error)
    logging.shutdown()
    os._exit(2)


class _LazyApp:
    """Builds the app on first use, so importing ovtrio.app has no side effects beyond
    reading the environment when a server actually starts."""

    _app: QuartTrio | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            try:
                self._app = create_app()
            except SettingsError as exc:
                _exit_with(exc)
        await self._app(scope, receive, send)


app = _LazyApp()
