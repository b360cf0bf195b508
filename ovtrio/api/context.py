"""The app's shared objects, as handlers reach them: the served models (by the name a
request gives), the Responses store and the metrics registry. Read here and nowhere
else from the app's config."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from quart import Quart, current_app, has_request_context, request

from ovtrio.api import leases
from ovtrio.api.audio_admission import UploadAdmission
from ovtrio.api.errors import APIError, invalid, model_not_found, shutting_down
from ovtrio.api.responses.store import ResponseStore
from ovtrio.serving.kinds import KINDS
from ovtrio.serving.registry import ModelRegistry
from ovtrio.serving.residency import LoadFailed, NoRoom, NotLoaded, Stopping
from ovtrio.serving.service import ModelService, ServingModel

_MODELS = "OVTRIO_MODELS"
_RESPONSES = "OVTRIO_RESPONSE_STORE"
_METRICS = "OVTRIO_METRICS"
_SOCKET_LIMITS = "OVTRIO_SOCKET_LIMITS"
_UPLOADS = "OVTRIO_UPLOAD_ADMISSION"


def attach(app: Quart, models: ModelRegistry, responses: ResponseStore, metrics: CollectorRegistry) -> None:
    app.config[_MODELS] = models
    app.config[_RESPONSES] = responses
    app.config[_METRICS] = metrics


def model_registry() -> ModelRegistry:
    """Every served model, ready or not (health, model list), and the shutdown state."""
    return current_app.config[_MODELS]


async def model_service(name: str | None = None) -> ModelService:
    """The service of the model named `name`, ready or not (None: the first model, for
    endpoints where `model` is optional); a 404 naming it if the server has none."""
    models = model_registry()
    if name is None:
        if models.default is None:
            raise invalid("Name the model this request is for in 'model' (see GET /v1/models).", "model")
        return models.default
    service = await models.find(name)
    if service is None:
        encoder = next((encoder for encoder in models.encoders if encoder.name == name), None)
        if encoder is not None:
            raise invalid(
                f"The model '{name}' is a{'n' if encoder.kind == 'embedding' else ''} {encoder.kind} model; it serves"
                f" {' and '.join(KINDS[encoder.kind].routes)}, not this endpoint.",
                "model",
                "model_kind_mismatch",
            )
        raise model_not_found(name)
    return service


# Requests a page of any origin has a visitor's browser send without asking it (an
# <img> tag's GET carries no Origin header, and no API key is needed to send one): they
# read what is loaded and never load a model, nor make another unload for its room.
READ_ONLY_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


async def ready_model(name: str | None = None, keep_alive: float | None = None) -> ServingModel:
    """The loaded model named `name` and its scheduler (see model_service), once loaded:
    a model that loads at start is waited for as one that loads on demand
    (ovtrio/serving/residency.py). A 404 for an unknown model, or an unloaded one when
    the server loads models only when asked; a 503 when its load failed or found no
    room. `keep_alive`: the request's (seconds the model stays loaded after it).

    A GET (READ_ONLY_METHODS) gets the model only if it is loaded, and leaves its idle
    time running: a 409 when it is not loaded, a 503 while it loads or after it failed.

    Any other request holds a lease on the model until its response has ended
    (ovtrio/api/leases.py): the model is not unloaded under it."""
    service = await model_service(name)
    models = model_registry()
    if service.failed.is_set() and (service.ready.is_set() or models.counts_for_readiness(service)):
        # Ready before it failed: it stopped while serving (serving/service.py).
        what = "is unavailable" if service.ready.is_set() else "failed to load"
        raise APIError(503, f"The model '{service.model_name}' {what}: {service.failure}", code="model_unavailable")
    if models.counts_for_readiness(service):
        # Loading at start: the server is not ready yet, and says so to each request as
        # its readiness does (a load balancer sends them elsewhere meanwhile).
        raise APIError(503, "The model is still loading; retry shortly.", code="model_loading", retry_after=1)
    if has_request_context() and request.method in READ_ONLY_METHODS:
        return _loaded_for_reading(service, models)
    try:
        serving, lease = await models.take_lease(service, keep_alive)
    except NotLoaded:
        raise APIError(
            404,
            f"The model '{service.model_name}' is not loaded, and this server loads models only when asked"
            f' (--no-models-autoload): load it with POST /models/load {{"model": "{service.model_name}"}}.',
            param="model",
            code="model_not_loaded",
        ) from None
    except LoadFailed as exc:
        # Retry-After: when the server loads it again (sooner if its file changes).
        raise APIError(
            503,
            f"The model '{service.model_name}' failed to load: {exc}",
            code="model_unavailable",
            retry_after=exc.retry_after,
        ) from None
    except NoRoom as exc:
        raise APIError(503, str(exc), code="model_unavailable", retry_after=exc.retry_after) from None
    except Stopping:
        raise shutting_down() from None
    leases.hold(lease)
    return serving


def _loaded_for_reading(service: ModelService, models: ModelRegistry) -> ServingModel:
    serving = models.residency.loaded(service)
    if serving is not None:
        return serving
    status = models.status(service)
    if status == "failed":
        raise APIError(
            503,
            f"The model '{service.model_name}' failed to load: {service.failure}",
            code="model_unavailable",
            retry_after=models.residency.failed_loads.retry_after(service),
        )
    if status == "draining":
        raise shutting_down()
    if status == "loading":
        raise APIError(
            503, f"The model '{service.model_name}' is loading; retry shortly.", code="model_loading", retry_after=1
        )
    raise APIError(
        409,
        f"The model '{service.model_name}' is {status}, and a GET request loads no model: load it with POST"
        f' /models/load {{"model": "{service.model_name}"}} (or any POST request naming it), then ask again.',
        param="model",
        code="model_not_loaded",
    )


async def generation_model(name: str, keep_alive: float | None = None) -> ServingModel:
    """The ready model named `name`, for a new generation request; also a 503 once the
    server has begun to shut down (ovtrio/serving/shutdown.py): those in flight may finish, new
    ones go elsewhere."""
    if model_registry().shutdown.draining.is_set():
        raise shutting_down()
    return await ready_model(name, keep_alive)


def upload_admission() -> UploadAdmission:
    """The audio uploads in hand (ovtrio/api/audio_admission.py), one count per app."""
    admission: UploadAdmission = current_app.config.setdefault(_UPLOADS, UploadAdmission())
    return admission


def response_store() -> ResponseStore:
    """The stored responses, for retrieval and previous_response_id."""
    return current_app.config[_RESPONSES]


def metrics_registry() -> CollectorRegistry:
    return current_app.config[_METRICS]


def registry_of(app: Quart) -> ModelRegistry:
    """The served models of `app`, outside a request (the launcher)."""
    return app.config[_MODELS]


@dataclass(frozen=True)
class SocketLimits:
    """What one Responses WebSocket may do: its largest message, and how long it may
    stay open idle."""

    max_message_bytes: int
    idle_timeout: float


def attach_socket_limits(app: Quart, limits: SocketLimits) -> None:
    app.config[_SOCKET_LIMITS] = limits


def socket_limits() -> SocketLimits:
    return current_app.config[_SOCKET_LIMITS]
