"""Liveness (/health, /v2/health/live), readiness of the server (/health/ready, /ready,
/v2/health/ready) and of one model (/v2/models/{name}/ready, as KServe's Open Inference
Protocol and OVMS have it), and every model's status as OVMS's config status API
(/v1/config) reports it.

The server is ready when every model it loads at start is (models loaded on demand, as
those of --models-dir, do not count: the server takes requests for them unloaded). Each
readiness body lists the models with their status: loading, ready, failed (with the
reason), draining, unloaded or unloading. A model
that failed to load keeps the server unready while the others serve; liveness fails
only when every model has failed (the server then exits).

While the server drains (ovtrio/serving/shutdown.py), readiness is 503 so that load balancers
stop sending it requests, and liveness stays 200: the process is healthy, and a failed
liveness probe would have it killed before its requests have finished."""

from __future__ import annotations

from typing import Any

from quart import Blueprint

from ovtrio.api.context import model_registry, model_service
from ovtrio.serving.service import ModelService

blueprint = Blueprint("health", __name__)


def _model_status(service: ModelService) -> dict[str, Any]:
    status: dict[str, Any] = {"id": service.model_name, "status": model_registry().status(service)}
    if service.failed.is_set():
        status["reason"] = service.failure
    return status


@blueprint.get("/health")
@blueprint.get("/v2/health/live")
async def liveness() -> Any:
    models = model_registry()
    if models.failed.is_set():
        first = models.services[0]
        return {"status": "failed", "reason": first.failure}, 503
    return {"status": "ok"}


@blueprint.get("/health/ready")
@blueprint.get("/ready")
@blueprint.get("/v2/health/ready")
async def readiness() -> Any:
    """200 once every model loaded at start serves (those loaded on demand do not
    count, in whatever state); else 503, with the server's status the first of failed,
    draining and loading that applies."""
    models = model_registry()
    statuses = [_model_status(service) for service in models.services]
    body: dict[str, Any] = {"status": "ready", "models": statuses}
    if len(statuses) == 1:
        body["model"] = statuses[0]["id"]
    counted = [_model_status(service) for service in models.services if models.counts_for_readiness(service)]
    if models.shutdown.draining.is_set():
        counted = statuses
    for status in ("failed", "draining", "loading"):
        failing = [s for s in counted if s["status"] == status]
        if failing:
            body["status"] = status
            if status == "failed" and len(statuses) == 1:
                body["reason"] = failing[0]["reason"]
            return body, 503
    return body


@blueprint.get("/v2/models/<path:model_name>/ready")
async def model_readiness(model_name: str) -> Any:
    """One model: 200 when it serves, 503 while it loads, after it failed, or while the
    server drains; 404 (OpenAI's model_not_found) for a model the server does not serve."""
    status = _model_status(await model_service(model_name))
    return status, 200 if status["status"] == "ready" else 503


# OVMS's model states (TensorFlow Serving's) for ours; a model that failed to load has
# ended, with the reason as its error.
_OVMS_STATES = {
    "loading": "LOADING",
    "ready": "AVAILABLE",
    "draining": "UNLOADING",
    "unloading": "UNLOADING",
    "unloaded": "END",
    "failed": "END",
}


@blueprint.get("/v1/config")
async def config_status() -> Any:
    """OVMS's config status: each model's one version, its state and error."""
    models = model_registry()
    body = {}
    for service in models.services:
        status = _model_status(service)
        error = ("UNKNOWN", status["reason"]) if "reason" in status else ("OK", "")
        body[status["id"]] = {
            "model_version_status": [
                {
                    "version": "1",
                    "state": _OVMS_STATES[status["status"]],
                    "status": {"error_code": error[0], "error_message": error[1]},
                }
            ]
        }
    return body
