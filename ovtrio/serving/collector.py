"""The scheduler's gauges and totals, read from each model's `Scheduler.stats()` at
scrape time: the `ovtrio_*` names, labelled `model_name`, and the same numbers under
vLLM's names where vLLM has one (`vllm:num_requests_running`,
`vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`, `vllm:prompt_tokens_total`,
`vllm:generation_tokens_total`). Registered in the app's registry beside what
ovtrio/serving/metrics.py records as things happen; GET /metrics (ovtrio/api/metrics.py)
serves them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ovtrio.scheduler import SchedulerStats, added_to
from ovtrio.serving.kinds import Encoder
from ovtrio.serving.metrics import ENGINE, LABELS
from ovtrio.serving.registry import ModelRegistry
from ovtrio.serving.service import ModelService

# A series read off the scheduler: name, help, gauge or counter, and its value.
_Series = tuple[str, str, type[GaugeMetricFamily] | type[CounterMetricFamily], Callable[[SchedulerStats], float]]

# The scheduler's own numbers.
_OVTRIO_SERIES: tuple[_Series, ...] = (
    ("ovtrio_requests_running", "Requests in the engine", GaugeMetricFamily, lambda s: s.running),
    ("ovtrio_requests_waiting", "Requests queued for room in the engine", GaugeMetricFamily, lambda s: s.queued),
    (
        "ovtrio_requests_paused",
        "Running requests paused because their client is not reading",
        GaugeMetricFamily,
        lambda s: s.paused,
    ),
    (
        "ovtrio_requests_rejected",
        "Requests refused with 429 because the server was full",
        CounterMetricFamily,
        lambda s: s.rejected,
    ),
    (
        "ovtrio_slow_readers_cancelled",
        "Requests cancelled because their client stopped reading",
        CounterMetricFamily,
        lambda s: s.slow_readers_cancelled,
    ),
    ("ovtrio_engine_requests", "Unfinished requests inside the engine", GaugeMetricFamily, lambda s: s.engine_requests),
    (
        "ovtrio_engine_scheduled_requests",
        "Requests in the engine's last step",
        GaugeMetricFamily,
        lambda s: s.engine_scheduled,
    ),
    ("ovtrio_kv_cache_usage_percent", "KV cache in use", GaugeMetricFamily, lambda s: s.kv_cache_usage),
    ("ovtrio_engine_steps", "Engine steps run", CounterMetricFamily, lambda s: s.steps),
    ("ovtrio_engine_step_seconds", "Time spent inside engine steps", CounterMetricFamily, lambda s: s.step_seconds),
    ("ovtrio_generated_tokens", "Tokens generated", CounterMetricFamily, lambda s: s.generated_tokens),
    (
        "ovtrio_engine_steps_started",
        "Engine steps entered, empty ones included",
        CounterMetricFamily,
        lambda s: s.steps_started,
    ),
    (
        "ovtrio_prefill_slices",
        "Slices of long prompts prefilled in steps of their own",
        CounterMetricFamily,
        lambda s: s.prefill_slices,
    ),
    (
        "ovtrio_prefill_slice_tokens",
        "Prompt tokens of those slices",
        CounterMetricFamily,
        lambda s: s.prefill_slice_tokens,
    ),
    (
        "ovtrio_engine_step_in_flight",
        "1 while the engine is inside a step (seen only when steps release the GIL)",
        GaugeMetricFamily,
        lambda s: int(s.step_in_flight),
    ),
    (
        "ovtrio_engine_step_releases_gil",
        "1 if engine steps run without the GIL, so the server answers during them",
        GaugeMetricFamily,
        lambda s: int(s.step_releases_gil),
    ),
)

# vLLM's names for the same numbers (vllm/v1/metrics/loggers.py).
_VLLM_SERIES: tuple[_Series, ...] = (
    (
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        GaugeMetricFamily,
        lambda s: s.engine_scheduled,
    ),
    (
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        GaugeMetricFamily,
        lambda s: s.waiting,
    ),
    (
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        GaugeMetricFamily,
        lambda s: s.kv_cache_usage / 100,
    ),
    ("vllm:prompt_tokens", "Number of prefill tokens processed.", CounterMetricFamily, lambda s: s.prompt_tokens),
    (
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        CounterMetricFamily,
        lambda s: s.generated_tokens,
    ),
)


class SchedulerCollector(Collector):
    """Each loaded model's scheduler numbers, one series per model: the ovtrio_ names
    labelled `model_name`, vLLM's with `model_name` and `engine` as vLLM labels them."""

    def __init__(self, models: ModelRegistry) -> None:
        self._models = models

    def collect(self) -> Iterator[Any]:
        # A loaded model's numbers, its counters going on from its earlier loads; an
        # unloaded one's counters only (it has nothing running or waiting).
        rows: list[tuple[str, SchedulerStats, bool]] = []
        for service in self._models.services:
            serving = service.serving
            if serving is not None:
                rows.append((serving.name, added_to(service.earlier_totals, serving.scheduler.stats()), True))
            elif service.earlier_totals is not None:
                rows.append((service.model_name, service.earlier_totals, False))
        if not rows:
            return
        for name, documentation, kind, value in _OVTRIO_SERIES:
            family = kind(name, documentation, labels=("model_name",))
            for model_name, numbers, loaded in rows:
                if loaded or kind is CounterMetricFamily:
                    family.add_metric([model_name], value(numbers))
            yield family
        for name, documentation, kind, value in _VLLM_SERIES:
            family = kind(name, documentation, labels=LABELS)
            for model_name, numbers, loaded in rows:
                if loaded or kind is CounterMetricFamily:
                    family.add_metric([model_name, ENGINE], value(numbers))
            yield family


# What a generation model's state is, as the gauge ovtrio_model_state shows it.
MODEL_STATES = ("unloaded", "loading", "loaded", "failed", "unloading")


class ModelStateCollector(Collector):
    """Each model's state at scrape time (the embedding and rerank models' too): ovtrio_model_loaded (1 when it
    serves) and ovtrio_model_state (1 for its state, 0 for the others)."""

    def __init__(self, models: ModelRegistry) -> None:
        self._models = models

    def collect(self) -> Iterator[Any]:
        services: list[ModelService | Encoder] = [
            *self._models.services,
            *self._models.encoders,
        ]
        if not services:
            return
        loaded = GaugeMetricFamily(
            "ovtrio_model_loaded", "1 when the model is loaded and serves, else 0", labels=("model_name",)
        )
        state = GaugeMetricFamily(
            "ovtrio_model_state", "The model's state: 1 for the one it is in", labels=("model_name", "state")
        )
        for service in services:
            now = service.state
            name = service.name
            loaded.add_metric([name], 1.0 if now == "loaded" else 0.0)
            for each in MODEL_STATES:
                state.add_metric([name, each], 1.0 if now == each else 0.0)
        yield loaded
        yield state
