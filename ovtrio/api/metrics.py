"""GET /metrics: Prometheus text format.

Three sources share one registry per app (ovtrio.metrics.ServerMetrics):

- gauges and totals read from `Scheduler.stats()` at scrape time (SchedulerCollector):
  the `ovtrio_*` names, and the same numbers under vLLM's names where vLLM has one
  (`vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`,
  `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`);
- request histograms and finish counts, recorded by the scheduler as requests run
  (ovtrio.metrics.ModelMetrics);
- HTTP responses by route and status, counted here as each response is made (`install`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from quart import Blueprint, Quart, Response, request

from ovtrio.api.context import metrics_registry
from ovtrio.metrics import ENGINE, LABELS, ServerMetrics
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
        yield GaugeMetricFamily("ovtrio_requests_running", "Requests the scheduler is serving", value=stats.running)
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

        # vLLM's names for the same numbers (vllm/v1/metrics/loggers.py).
        labels = [serving.name, ENGINE]

        def labelled(family: GaugeMetricFamily | CounterMetricFamily, value: float) -> Any:
            family.add_metric(labels, value)
            return family

        yield labelled(
            GaugeMetricFamily(
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                labels=LABELS,
            ),
            stats.engine_scheduled,
        )
        yield labelled(
            GaugeMetricFamily(
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
                labels=LABELS,
            ),
            stats.waiting,
        )
        yield labelled(
            GaugeMetricFamily(
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                labels=LABELS,
            ),
            stats.kv_cache_usage / 100,
        )
        yield labelled(
            CounterMetricFamily("vllm:prompt_tokens", "Number of prefill tokens processed.", labels=LABELS),
            stats.prompt_tokens,
        )
        yield labelled(
            CounterMetricFamily("vllm:generation_tokens", "Number of generation tokens processed.", labels=LABELS),
            stats.generated_tokens,
        )


def registry_for(service: ModelService, metrics: ServerMetrics) -> CollectorRegistry:
    """The app's registry: what `metrics` records, and the scheduler's numbers."""
    metrics.registry.register(SchedulerCollector(service))
    return metrics.registry


def install(app: Quart, metrics: ServerMetrics) -> None:
    """Count every HTTP response by method, route and status: routed or not, errors
    (including refusals before routing) and streams alike. A stream is counted once,
    when its response starts (its status cannot change after)."""

    @app.after_request
    async def count_response(response: Response) -> Response:
        rule = request.url_rule
        metrics.response(request.method, rule.rule if rule is not None else "unmatched", response.status_code)
        return response


@blueprint.get("/metrics")
async def metrics() -> Any:
    return Response(generate_latest(metrics_registry()), mimetype="text/plain; version=0.0.4")
