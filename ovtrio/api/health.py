"""Liveness (/health) and readiness (/health/ready, also /ready) probes.

While the server drains (ovtrio/shutdown.py), readiness is 503 so that load balancers
stop sending it requests, and liveness stays 200: the process is healthy, and a failed
liveness probe would have it killed before its requests have finished."""

from __future__ import annotations

from typing import Any

from quart import Blueprint

from ovtrio.api.context import model_service

blueprint = Blueprint("health", __name__)


@blueprint.get("/health")
async def liveness() -> Any:
    service = model_service()
    if service.failed.is_set():
        return {"status": "failed", "reason": service.failure}, 503
    return {"status": "ok"}


@blueprint.get("/health/ready")
@blueprint.get("/ready")
async def readiness() -> Any:
    service = model_service()
    if service.failed.is_set():
        return {"status": "failed", "reason": service.failure}, 503
    if service.shutdown.draining.is_set():
        return {"status": "draining"}, 503
    if not service.ready.is_set():
        return {"status": "loading"}, 503
    return {"status": "ready", "model": service.model_name}
