"""The Quart-Trio application. `hypercorn -k trio ovtrio.app:app` serves it configured
from OVTRIO_* environment variables; `ovtrio serve` builds the same app from flags."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from quart import Response
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from ovtrio.api import generation, health, metrics, models, responses, responses_socket, tokenize
from ovtrio.api.errors import APIError
from ovtrio.config import Settings, settings_from_env
from ovtrio.model import ModelLoadError
from ovtrio.service import ModelService

log = logging.getLogger("ovtrio")


def configure_logging(level: str) -> None:
    logger = logging.getLogger("ovtrio")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s ovtrio %(levelname)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(level.upper())


def error_response(error: APIError) -> Response:
    return Response(
        _json(error.body()), status=error.status, mimetype="application/json"
    )


def _json(body: Any) -> str:
    import json

    return json.dumps(body, ensure_ascii=False)


def create_app(settings: Settings | None = None) -> QuartTrio:
    settings = settings or settings_from_env()
    configure_logging(settings.log_level)
    app = QuartTrio("ovtrio")
    # Streams may run for minutes: no response timeout; request bodies are small.
    app.config["RESPONSE_TIMEOUT"] = None
    app.config["BODY_TIMEOUT"] = 60
    app.config["MAX_CONTENT_LENGTH"] = 32 * 1024 * 1024
    service = ModelService(settings)
    app.config["OVTRIO_SERVICE"] = service
    app.config["OVTRIO_METRICS"] = metrics.registry_for(service)
    for module in (generation, responses, responses_socket, models, tokenize, health, metrics):
        app.register_blueprint(module.blueprint)

    @app.before_serving
    async def start_model() -> None:
        try:
            service.check()
        except ModelLoadError as exc:
            # One line and a non-zero exit, not the lifespan machinery's nested
            # traceback; there is nothing to clean up yet.
            log.error("%s", exc)
            logging.shutdown()
            os._exit(2)
        await app.nursery.start(service.run)

    @app.errorhandler(APIError)
    async def api_error(error: APIError) -> Response:
        return error_response(error)

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException) -> Response:
        status = error.code or 500
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(status)
        response = error_response(APIError(status, error.description or error.name, code=code))
        # A 405 must say which methods the route does allow (RFC 9110, 15.5.6).
        if isinstance(error, MethodNotAllowed) and error.valid_methods:
            response.headers["Allow"] = ", ".join(error.valid_methods)
        return response

    @app.errorhandler(Exception)
    async def unexpected_error(error: Exception) -> Response:
        log.exception("unhandled error")
        return error_response(APIError(500, "The server had an error while processing your request.", code="internal_error"))

    return app


class _LazyApp:
    """Builds the app on first use, so importing ovtrio.app has no side effects beyond
    reading the environment when a server actually starts."""

    _app: QuartTrio | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            self._app = create_app()
        await self._app(scope, receive, send)


app = _LazyApp()
