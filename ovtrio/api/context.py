"""The app's shared objects, as handlers reach them: the model service, the ready model,
the Responses store and the metrics registry. Read here and nowhere else from the
app's config."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from quart import Quart, current_app

from ovtrio.api.errors import APIError, shutting_down
from ovtrio.api.responses.store import ResponseStore
from ovtrio.service import ModelService, ServingModel

_SERVICE = "OVTRIO_SERVICE"
_RESPONSES = "OVTRIO_RESPONSE_STORE"
_METRICS = "OVTRIO_METRICS"


def attach(app: Quart, service: ModelService, responses: ResponseStore, metrics: CollectorRegistry) -> None:
    app.config[_SERVICE] = service
    app.config[_RESPONSES] = responses
    app.config[_METRICS] = metrics


def model_service() -> ModelService:
    """The service, ready or not (health, model list)."""
    return current_app.config[_SERVICE]


def ready_model() -> ServingModel:
    """The loaded model and its scheduler; a 503 while the model is still loading."""
    serving = model_service().serving
    if serving is None or not model_service().ready.is_set():
        raise APIError(503, "The model is still loading; retry shortly.", code="model_loading")
    return serving


def generation_model() -> ServingModel:
    """The ready model for a new generation request; also a 503 once the server has begun
    to shut down (ovtrio/shutdown.py): those in flight may finish, new ones go elsewhere."""
    if model_service().shutdown.draining.is_set():
        raise shutting_down()
    return ready_model()


def response_store() -> ResponseStore:
    """The stored responses, for retrieval and previous_response_id."""
    return current_app.config[_RESPONSES]


def metrics_registry() -> CollectorRegistry:
    return current_app.config[_METRICS]


def service_of(app: Quart) -> ModelService:
    """The service of `app`, outside a request (the launcher)."""
    return app.config[_SERVICE]
