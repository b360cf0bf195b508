"""The Quart-Trio application: its routes, limits and models, built from settings.
`ovtrio.app:app` serves it under the `hypercorn` command, `ovtrio serve` from flags."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import trio
from quart import Response
from quart.json.provider import DefaultJSONProvider
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, MethodNotAllowed, RequestEntityTooLarge

from ovtrio import seams
from ovtrio.api import (
    audio,
    auth,
    context,
    embeddings,
    framing,
    health,
    json_bodies,
    leases,
    metrics,
    models,
    origins,
    request_body,
    rerank,
    speech,
    tokenize,
)
from ovtrio.api.chat import routes as chat
from ovtrio.api.completions import routes as completions
from ovtrio.api.errors import api_error, error_response
from ovtrio.api.messages import errors as messages_errors
from ovtrio.api.messages import routes as messages
from ovtrio.api.ollama import errors as ollama_errors
from ovtrio.api.ollama import routes as ollama
from ovtrio.api.responses import routes as responses
from ovtrio.api.responses import socket as responses_socket
from ovtrio.api.responses.store import ResponseStore
from ovtrio.audio.service import transcription_models_to_serve
from ovtrio.embedding.kinds import ModelKind, served_models
from ovtrio.embedding.on_demand import EncoderLoader, load_encoder
from ovtrio.embedding.service import encoders_to_serve
from ovtrio.loading import ModelLoad, start_loading_in_order
from ovtrio.model import ModelLoadError
from ovtrio.playground import routes as playground
from ovtrio.server import body_limit
from ovtrio.server.hypercorn_patches import (
    accept_errors,
    connection_close,
    websocket_message_size,
)
from ovtrio.server.logs import configure_logging
from ovtrio.serving import memory
from ovtrio.serving.discovery import FolderModel, folder_models
from ovtrio.serving.kinds import build_encoder
from ovtrio.serving.metrics import ServerMetrics
from ovtrio.serving.registry import ModelRegistry, rules_of
from ovtrio.serving.service import Loader
from ovtrio.settings.server import (
    Settings,
    api_keys,
    in_data_dir,
    settings_from_env,
)
from ovtrio.speech.service import speech_models_to_serve

log = logging.getLogger("ovtrio")


def create_app(
    settings: Settings | None = None,
    loading: Sequence[ModelLoad] | None = None,
    loader: Loader = start_loading_in_order,
    encoder_loader: EncoderLoader = load_encoder,
) -> QuartTrio:
    """The app for `settings` (default: from the environment), serving the model they
    name or those of their config file; `loading`, when given, is each model's load
    already under way (ovtrio.loading.start_loading_in_order); `loader` starts every
    other load of a generation model, and `encoder_loader` builds an encoder's model at
    each of its loads (the engine's seams: tests pass fakes). Raises SettingsError.

    In phases: the process-wide seams; what is served, read from the settings and the
    disk (the config file's models and their kinds, the models folder, the stored
    responses); the registry of the models; and the app over them, with no I/O."""
    settings = settings or settings_from_env()
    configure_logging(settings.log_level)
    install_process_seams(settings)
    served = ServedModels.read(settings)
    server_metrics = ServerMetrics()
    limit = body_limit.BodyLimit(
        settings, {}, vision=body_limit.takes_images_at_start(served.generation, served.in_folder), audio=served.audio
    )
    registry = build_registry(settings, served, server_metrics, loading, limit, loader, encoder_loader)
    return app_over(registry, settings, server_metrics, limit, response_store_of(settings))


def install_process_seams(settings: Settings) -> None:
    """Hypercorn's patches, which change the process (its classes), not one app; each
    recorded (ovtrio/seams.py) with what goes wrong without it."""
    seams.record(
        "connection close",
        "hypercorn",
        connection_close.apply(),
        "finished and idle connections stay open until their client closes them",
    )
    accept_errors.install()
    seams.record(
        "WebSocket message bound",
        "hypercorn",
        websocket_message_size.apply(settings.websocket_max_message_bytes),
        "a message over the limit closes the socket instead of an error event",
    )


@dataclass(frozen=True)
class ServedModels:
    """What the server serves at start, as the settings and the disk say: the generation
    models, the encoders configured (with their kind), the Whisper models, and what the
    models folder holds; the text-to-speech models after them."""

    generation: list[Settings]
    encoders: list[tuple[Settings, ModelKind]]
    transcribers: list[tuple[str, Settings, Path]]
    in_folder: list[FolderModel]
    speakers: list[tuple[str, Settings, Path]] = field(default_factory=list)

    @classmethod
    def read(cls, settings: Settings) -> ServedModels:
        generation, encoders = served_models(settings)
        transcribers = transcription_models_to_serve(settings, encoders)
        # What models_dir holds at start decides the body limit at start, and whether the
        # embedded embedder is served beside the folder's (not when the folder has one).
        in_folder = folder_models(Path(settings.models_dir).expanduser()) if settings.models_dir else []
        return cls(generation, encoders, transcribers, in_folder, speech_models_to_serve(settings, encoders))

    @property
    def audio(self) -> bool:
        return bool(self.transcribers) or any(model.kind == "transcription" for model in self.in_folder)


def build_registry(
    settings: Settings,
    served: ServedModels,
    server_metrics: ServerMetrics,
    loading: Sequence[ModelLoad] | None,
    limit: body_limit.BodyLimit,
    loader: Loader = start_loading_in_order,
    encoder_loader: EncoderLoader = load_encoder,
) -> ModelRegistry:
    """The registry of the served models, each one's resident built (none loaded yet);
    `loader` and `encoder_loader` are the registry's (ModelRegistry)."""
    encoder_metrics = server_metrics.encoders
    text_encoders = [(model, kind) for model, kind in served.encoders if kind not in ("transcription", "speech")]
    embedded = not any(model.kind == "embedding" for model in served.in_folder)
    encoders = [
        build_encoder(name, kind, encoder_settings, folder, encoder_metrics.for_model)
        for name, kind, encoder_settings, folder in encoders_to_serve(settings, text_encoders, embedded=embedded)
    ]
    encoders += [
        build_encoder(name, "transcription", model_settings, folder, encoder_metrics.for_model)
        for name, model_settings, folder in served.transcribers
    ]
    encoders += [
        build_encoder(name, "speech", model_settings, folder, encoder_metrics.for_model)
        for name, model_settings, folder in served.speakers
    ]
    registry = ModelRegistry(
        served.generation,
        settings.drain_timeout,
        observer=server_metrics.for_model,
        loading=loading,
        encoders=encoders,
        models_dir=settings if settings.models_dir else None,
        rules=rules_of(settings),
        lifecycle=server_metrics.lifecycle,
        encoder_observer=encoder_metrics.for_model,
        on_rescan=lambda: limit.follow(registry.takes_images(), registry.takes_audio()),
        on_forget=server_metrics.forget,
        loader=loader,
        encoder_loader=encoder_loader,
    )
    if settings.models_dir:
        limit.rescan = registry.rescan
    return registry


def response_store_of(settings: Settings) -> ResponseStore:
    """The stored responses (read from the data dir when they are kept there)."""
    store_path = in_data_dir(settings, settings.response_store_path)
    if store_path is not None and settings.data_dir is not None:
        os.makedirs(os.path.expanduser(settings.data_dir), exist_ok=True)  # an empty volume may lack it
    return ResponseStore(
        settings.response_store_size,
        settings.response_store_ttl,
        store_path,
        max_bytes=settings.response_store_bytes,
    )


def app_over(
    registry: ModelRegistry,
    settings: Settings,
    server_metrics: ServerMetrics,
    limit: body_limit.BodyLimit,
    store: ResponseStore,
) -> QuartTrio:
    """The app serving `registry`: routes, middleware and error handlers, and a lifespan
    that starts the registry, and drains and closes it. Reads no file and patches nothing."""
    app = QuartTrio("ovtrio")
    if seams.record(
        "uncopied request bodies",
        "quart-trio",
        request_body.fits_quart_trio(),
        "bodies are copied as they grow and when read",
    ):
        app.request_class = request_body.UncopiedRequest
    framing.install(app)
    # Streams may run for minutes: no response timeout; request bodies are small.
    app.config["RESPONSE_TIMEOUT"] = None
    app.config["BODY_TIMEOUT"] = 60
    # A body over the limit is refused (413) before it is read when its Content-Length
    # says so, and as soon as it passes the limit otherwise. The limit follows the models
    # served (body_limit.py).
    limit.keep_in(app.config)
    # Bodies keep the order they are built in: a top_logprobs object lists the most
    # likely token first (Quart would sort the keys).
    assert isinstance(app.json, DefaultJSONProvider)
    app.json.sort_keys = False
    body_limit.install(app, limit)
    leases.install(app)
    context.attach(app, registry, store, metrics.registry_for(registry, server_metrics, store))
    metrics.install(app, server_metrics)
    # Host and Origin first: a preflight carries no key, and a refused page learns nothing.
    origins.install(app, origins.OriginPolicy.from_settings(settings.allowed_hosts, settings.allowed_origins))
    page_paths: frozenset[str] = frozenset()
    if settings.playground:
        page, page_paths = playground.create_blueprint(probe=ollama.probe_answer)
        app.register_blueprint(page)
    # `/` is open as the probes are: to a client that is no browser it says only that the
    # server runs ("Ollama is running"), which Ollama's clients check before they send a key.
    auth.install(app, auth.KeyCheck(api_keys(settings), settings.protect_metrics, page_paths | {"/"}))
    json_bodies.install(app)
    context.attach_socket_limits(
        app, context.SocketLimits(settings.websocket_max_message_bytes, settings.websocket_idle_timeout)
    )
    for module in (
        completions,
        chat,
        responses,
        responses_socket,
        embeddings,
        rerank,
        audio,
        speech,
        models,
        tokenize,
        health,
        metrics,
    ):
        app.register_blueprint(module.blueprint)
    app.register_blueprint(messages.blueprint)
    messages_errors.install()
    app.register_blueprint(ollama.blueprint)  # after the playground: its page answers browsers on /
    ollama_errors.install()
    _serve_registry(app, registry)
    _answer_errors(app, limit)
    return app


def _serve_registry(app: QuartTrio, registry: ModelRegistry) -> None:
    """The lifespan: the registry starts before the first request and is drained and
    closed after the last."""
    trimming: list[trio.CancelScope] = []  # the task that returns free memory, ended at shutdown

    @app.before_serving
    async def start_models() -> None:
        try:
            registry.check()
        except ModelLoadError as exc:
            # One line and a non-zero exit, not the lifespan machinery's nested
            # traceback; there is nothing to clean up yet.
            exit_with_error(exc)
        memory.configure_allocator()
        await app.nursery.start(registry.run)
        log.info("%s", seams.startup_line())
        trimming.append(await app.nursery.start(memory.trim_in_background))

    @app.after_serving
    async def release_models() -> None:
        # Hypercorn runs this once every connection has ended. The drain is over by then:
        # `ovtrio serve` runs it while still listening, and so does Hypercorn's own worker
        # (ovtrio/server/hypercorn_patches/drain.py), unless that patch could not be applied, and then the
        # drain finds nothing left in flight. Either way nothing can reach the engine any more.
        await registry.drain("hypercorn stopping")
        await registry.close()
        for scope in trimming:
            scope.cancel()


def _answer_errors(app: QuartTrio, limit: body_limit.BodyLimit) -> None:
    """Every error in OpenAI's shape (ovtrio/api/errors.py)."""

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException) -> Response:
        if isinstance(error, RequestEntityTooLarge):
            error = RequestEntityTooLarge(
                f"The request body is larger than the {limit.bytes} bytes this server accepts"
                " (--max-body-bytes, and for images --max-image-bytes x --max-images-per-request"
                + (", for audio --audio-max-bytes)." if limit.audio else ").")
            )
        response = error_response(api_error(error))
        # A 405 must say which methods the route does allow (RFC 9110, 15.5.6).
        if isinstance(error, MethodNotAllowed) and error.valid_methods:
            response.headers["Allow"] = ", ".join(error.valid_methods)
        return response

    @app.errorhandler(Exception)
    async def request_error(error: Exception) -> Response:
        return error_response(api_error(error))


def exit_with_error(error: Exception) -> NoReturn:
    """Log a startup error and end the process with status 2 (a worker cannot raise it)."""
    log.error("%s", error)
    logging.shutdown()
    os._exit(2)
