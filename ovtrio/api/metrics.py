"""GET /metrics: Prometheus text format.

Four sources share one registry per app (ovtrio.serving.metrics.ServerMetrics):

- gauges and totals read from each model's `Scheduler.stats()` at scrape time
  (ovtrio.serving.collector.SchedulerCollector), and each model's state
  (ModelStateCollector), beside the counts of its loads and unloads
  (ovtrio.serving.metrics.LifecycleMetrics);
- request histograms and finish counts, recorded by the scheduler as requests run
  (ovtrio.serving.metrics.ModelMetrics);
- HTTP responses by route and status, counted here as each response is made (`install`);
- the memory kept between requests, read at scrape time (MemoryCollector).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from quart import Blueprint, Quart, Response, request

from ovtrio.api.context import metrics_registry, model_registry
from ovtrio.api.responses.store import ResponseStore
from ovtrio.constraints import cache as grammar_cache
from ovtrio.serving.collector import ModelStateCollector, SchedulerCollector
from ovtrio.serving.metrics import ServerMetrics
from ovtrio.serving.registry import ModelRegistry

blueprint = Blueprint("metrics", __name__)


class MemoryCollector(Collector):
    """What the server keeps between requests, in bytes: compiled grammars (XGrammar's
    estimate, every model's engine together) and stored responses."""

    def __init__(self, store: ResponseStore | None) -> None:
        self._store = store

    def collect(self) -> Iterator[Any]:
        yield GaugeMetricFamily(
            "ovtrio_grammar_cache_bytes",
            "Bytes of compiled grammars the engines keep for reuse (XGrammar's estimate)",
            value=grammar_cache.cache_bytes(),
        )
        yield GaugeMetricFamily(
            "ovtrio_grammar_compilers",
            "Grammar compilers of the loaded engines, whose caches ovtrio_grammar_cache_bytes counts",
            value=grammar_cache.compilers(),
        )
        if self._store is not None:
            yield GaugeMetricFamily(
                "ovtrio_response_store_bytes", "Bytes of memory the stored responses take", value=self._store.bytes
            )
            yield GaugeMetricFamily(
                "ovtrio_response_store_entries", "Stored responses in memory", value=len(self._store)
            )


def registry_for(
    models: ModelRegistry, metrics: ServerMetrics, store: ResponseStore | None = None
) -> CollectorRegistry:
    """The app's registry: what `metrics` records, the schedulers' numbers, and the
    memory kept between requests."""
    metrics.registry.register(SchedulerCollector(models))
    metrics.registry.register(ModelStateCollector(models))
    metrics.registry.register(MemoryCollector(store))
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
    # The folder is read again first, as GET /v1/models does: the two tell of the same
    # models, a model whose file is gone (and that is unloaded) no longer in either.
    await model_registry().rescan()
    return Response(generate_latest(metrics_registry()), mimetype="text/plain; version=0.0.4")
