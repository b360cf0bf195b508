"""GET /metrics: Prometheus text format, read from the scheduler at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from quart import Blueprint, Response

from ovtrio.api.context import metrics_registry
from ovtrio.service import ModelService

blueprint = Blueprint("metrics", __name__)


class SchedulerCollector(Collector):
    def __init__(self, service: ModelService) -> None:
        self._service = service

    def collect(self) -> Iterator[Any]:
        serving = self._service.serving
        if serving is None:
            return
        stats = serving.scheduler.stats()
        yield GaugeMetricFamily("ovtrio_requests_running", "Requests in the engine", value=stats.running)
        yield GaugeMetricFamily(
            "ovtrio_requests_waiting", "Requests queued for room in the engine", value=stats.waiting
        )
        yield GaugeMetricFamily(
            "ovtrio_requests_paused", "Running requests paused because their client is not reading", value=stats.paused
        )
        yield CounterMetricFamily(
            "ovtrio_requests_rejected", "Requests refused with 429 because the server was full", value=stats.rejected
        )
        yield CounterMetricFamily(
            "ovtrio_slow_readers_cancelled",
            "Requests cancelled because their client stopped reading",
            value=stats.slow_readers_cancelled,
        )
        yield GaugeMetricFamily(
            "ovtrio_engine_requests", "Unfinished requests inside the engine", value=stats.engine_requests
        )
        yield GaugeMetricFamily(
            "ovtrio_engine_scheduled_requests", "Requests in the engine's last step", value=stats.engine_scheduled
        )
        yield GaugeMetricFamily("ovtrio_kv_cache_usage_percent", "KV cache in use", value=stats.kv_cache_usage)
        yield CounterMetricFamily("ovtrio_engine_steps", "Engine steps run", value=stats.steps)
        yield CounterMetricFamily(
            "ovtrio_engine_step_seconds", "Time spent inside engine steps", value=stats.step_seconds
        )
        yield CounterMetricFamily("ovtrio_generated_tokens", "Tokens generated", value=stats.generated_tokens)
        yield CounterMetricFamily(
            "ovtrio_engine_steps_started", "Engine steps entered, empty ones included", value=stats.steps_started
        )
        yield GaugeMetricFamily(
            "ovtrio_engine_step_in_flight",
            "1 while the engine is inside a step (seen only when steps release the GIL)",
            value=int(stats.step_in_flight),
        )
        yield GaugeMetricFamily(
            "ovtrio_engine_step_releases_gil",
            "1 if engine steps run without the GIL, so the server answers during them",
            value=int(stats.step_releases_gil),
        )


def registry_for(service: ModelService) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SchedulerCollector(service))
    return registry


@blueprint.get("/metrics")
async def metrics() -> Any:
    return Response(generate_latest(metrics_registry()), mimetype="text/plain; version=0.0.4")
