"""The server's Prometheus metrics that are recorded as things happen: request
histograms and finish counts (fed by the scheduler through its RequestObserver), and
HTTP responses by route and status (fed by the API layer). Gauges and totals read off
the scheduler at scrape time are in ovtrio/serving/collector.py, in the same registry.

Names, types, labels and bucket boundaries are vLLM's (vllm/v1/metrics/loggers.py), so
the Gateway API Inference Extension's endpoint picker and dashboards made for vLLM read
ovtrio as they read vLLM: every series has the labels `model_name` (the served model
name; one series per model when the server serves several) and `engine` ("0"). The metrics live in a registry of
their own per app (not prometheus_client's global one), so several apps can live in one
process.

A model's series live as long as the server serves it: across its unloads and loads
(its counters go on), until the registry forgets it (its file gone from models_dir,
ovtrio/serving/registry.py), when each series labelled with its name goes (`forget`).
A model of that name found later starts from zero.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.metrics import MetricWrapperBase

from ovtrio.embedding.metrics import EncoderMetrics

LABELS = ("model_name", "engine")
ENGINE = "0"

# vLLM's FinishReason values, all shown from the start (at 0) as vLLM does.
FINISH_REASONS = ("stop", "length", "abort", "error")

TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


IMAGE_PREPROCESS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def one_two_five_buckets(limit: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to `limit` (vLLM's token-count buckets, up to the
    model's context length)."""
    buckets: list[int] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > limit:
                return buckets
            buckets.append(mantissa * scale)
        scale *= 10


class RequestFamilies:
    """The request metric families of one registry, shared by every served model (each
    observes through its own labelled children). Token counts are bucketed up to
    `token_limit`: one family has one set of buckets, so with several models, the
    longest context of them all."""

    def __init__(self, registry: CollectorRegistry, token_limit: int) -> None:
        self._registry = registry

        def histogram(name: str, documentation: str, buckets: tuple[float, ...] | list[int]) -> Histogram:
            return Histogram(name, documentation, LABELS, buckets=buckets, registry=registry)

        token_counts = one_two_five_buckets(token_limit)
        self.queue = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.time_to_first_token = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TIME_TO_FIRST_TOKEN_BUCKETS,
        )
        self.inter_token = histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", TOKEN_LATENCY_BUCKETS
        )
        self.time_per_output_token = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            TOKEN_LATENCY_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQUEST_LATENCY_BUCKETS
        )
        self.prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_counts
        )
        self.generation_tokens = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", token_counts
        )
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            (*LABELS, "finished_reason"),
            registry=registry,
        )
        self._speculation: tuple[Counter, Counter, Counter] | None = None
        self._images: tuple[Counter, Histogram] | None = None

    def forget(self, model_name: str) -> None:
        """Remove every series of `model_name`."""
        families: list[MetricWrapperBase] = [
            self.queue,
            self.time_to_first_token,
            self.inter_token,
            self.time_per_output_token,
            self.e2e,
            self.prompt_tokens,
            self.generation_tokens,
            self.success,
            *(self._speculation or ()),
            *(self._images or ()),
        ]
        for family in families:
            family.remove_by_labels({"model_name": model_name})

    def images(self) -> tuple[Counter, Histogram]:
        """The image counters, registered when the first vision-language model asks."""
        if self._images is None:
            self._images = (
                Counter(
                    "ovtrio_images", "Images of requests, read and decoded", ("model_name",), registry=self._registry
                ),
                Histogram(
                    "ovtrio_image_preprocess_seconds",
                    "Time to read and decode one image (data URL or fetch, decode, RGB, resize)",
                    ("model_name",),
                    buckets=IMAGE_PREPROCESS_BUCKETS,
                    registry=self._registry,
                ),
            )
        return self._images

    def speculation(self) -> tuple[Counter, Counter, Counter]:
        """The spec_decode counters, registered when the first speculating model asks (vLLM
        serves them only with a speculative config, too). vLLM's names
        (vllm/v1/spec_decode/metrics.py): acceptance rate is rate(accepted_tokens) /
        rate(draft_tokens)."""
        if self._speculation is None:

            def counter(name: str, documentation: str) -> Counter:
                return Counter(name, documentation, LABELS, registry=self._registry)

            self._speculation = (
                counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
                counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
                counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."),
            )
        return self._speculation


class ModelMetrics:
    """The request metrics of one served model: a RequestObserver for its scheduler.

    Holds the labelled children, so an observation is one `observe()` or `inc()` on a
    prometheus_client object, with no label lookup, as one is made per choice and step
    (see docs/benchmarks.md#request-metrics).
    """

    def __init__(self, families: RequestFamilies, model_name: str, speculative: bool = False) -> None:
        """`speculative`: the pipeline speculates, so the spec_decode counters are served."""
        self._families = families
        self._model_name = model_name
        labels = (model_name, ENGINE)
        self._queue = families.queue.labels(*labels)
        self._time_to_first_token = families.time_to_first_token.labels(*labels)
        self._inter_token = families.inter_token.labels(*labels)
        self._time_per_output_token = families.time_per_output_token.labels(*labels)
        self._e2e = families.e2e.labels(*labels)
        self._prompt_tokens = families.prompt_tokens.labels(*labels)
        self._generation_tokens = families.generation_tokens.labels(*labels)
        self._success = {reason: families.success.labels(*labels, reason) for reason in FINISH_REASONS}
        # Drafts, drafted tokens and accepted tokens, for a speculative model.
        self._speculation: tuple[Counter, Counter, Counter] | None = None
        if speculative:
            drafts, draft_tokens, accepted_tokens = families.speculation()
            self._speculation = (
                drafts.labels(*labels),
                draft_tokens.labels(*labels),
                accepted_tokens.labels(*labels),
            )

    def queued(self, seconds: float) -> None:
        self._queue.observe(seconds)

    def first_token(self, seconds: float) -> None:
        self._time_to_first_token.observe(seconds)

    def inter_token(self, seconds: float) -> None:
        self._inter_token.observe(seconds)

    def finished(
        self, reason: str, prompt_tokens: int, generation_tokens: int, e2e: float, time_per_output_token: float
    ) -> None:
        self._success[reason].inc()
        self._e2e.observe(e2e)
        self._prompt_tokens.observe(prompt_tokens)
        self._generation_tokens.observe(generation_tokens)
        self._time_per_output_token.observe(time_per_output_token)

    def speculated(self, drafted: int, accepted: int) -> None:
        if self._speculation is not None:
            drafts, draft_tokens, accepted_tokens = self._speculation
            drafts.inc()
            draft_tokens.inc(drafted)
            accepted_tokens.inc(accepted)

    def ended(self, reason: str) -> None:
        self._success[reason].inc()

    def image_prepared(self, seconds: float) -> None:
        """One image of a request was read and decoded in `seconds` (not a scheduler
        event: the API layer reports it, before the request is submitted)."""
        count, preprocess = self._families.images()
        count.labels(self._model_name).inc()
        preprocess.labels(self._model_name).observe(seconds)


# The methods the HTTP response counter names. A client may send any token as its
# method: counted under its own name, each made-up one would add series for good.
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"})


class ServerMetrics:
    """The app's registry and the metrics recorded into it as things happen."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._responses = Counter(
            "ovtrio_http_responses",
            "HTTP responses by method ('other' for one HTTP does not define), route (the matched route pattern,"
            " 'unmatched' for none) and status code; a stream counts once, with the status it started with",
            ("method", "route", "status"),
            registry=self.registry,
        )
        self.models: dict[str, ModelMetrics] = {}
        self._families: RequestFamilies | None = None
        self.lifecycle = LifecycleMetrics(self.registry)
        self.encoders = EncoderMetrics(self.registry)

    def for_model(self, model_name: str, context_length: int, speculative: bool = False) -> ModelMetrics:
        """The observer of a model's scheduler; made once per model, when it is loaded.
        The request families are made with the first model's, so their token-count
        buckets go up to its `context_length` (ModelRegistry passes the longest of all)."""
        if self._families is None:
            self._families = RequestFamilies(self.registry, context_length)
        if model_name not in self.models:
            self.models[model_name] = ModelMetrics(self._families, model_name, speculative)
        return self.models[model_name]

    def forget(self, model_name: str) -> None:
        """The server no longer serves `model_name`: remove its series, of every kind of
        model (a name may have been a generation model's, then an encoder's), and its
        observer (a model of that name served later gets a new one, from zero)."""
        self.models.pop(model_name, None)
        if self._families is not None:
            self._families.forget(model_name)
        self.lifecycle.forget(model_name)
        self.encoders.forget(model_name)

    def response(self, method: str, route: str, status: int) -> None:
        """Count one HTTP response; a method outside HTTP_METHODS counts as "other"."""
        self._responses.labels(method if method in HTTP_METHODS else "other", route, str(status)).inc()


LOAD_SECONDS_BUCKETS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)


class LifecycleMetrics:
    """Loads and unloads of each generation model (ovtrio/serving/residency.py); whether
    each is loaded now is read at scrape time (collector.ModelStateCollector)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._loads = Counter(
            "ovtrio_model_loads", "Loads of the model that ended serving it", ("model_name",), registry=registry
        )
        self._load_failures = Counter(
            "ovtrio_model_load_failures", "Loads of the model that failed", ("model_name",), registry=registry
        )
        self._unloads = Counter(
            "ovtrio_model_unloads",
            "Unloads of the model, by reason: request (POST /models/unload), idle (its keep-alive time passed),"
            " lru (room for another under --models-max)",
            ("model_name", "reason"),
            registry=registry,
        )
        self._load_seconds = Histogram(
            "ovtrio_model_load_seconds",
            "Time to load the model and warm it up, from the start of its load to serving",
            ("model_name",),
            buckets=LOAD_SECONDS_BUCKETS,
            registry=registry,
        )

    def loaded(self, model_name: str, seconds: float) -> None:
        self._loads.labels(model_name).inc()
        self._load_seconds.labels(model_name).observe(seconds)

    def load_failed(self, model_name: str) -> None:
        self._load_failures.labels(model_name).inc()

    def unloaded(self, model_name: str, reason: str) -> None:
        self._unloads.labels(model_name, reason).inc()

    def forget(self, model_name: str) -> None:
        for family in (self._loads, self._load_failures, self._unloads, self._load_seconds):
            family.remove_by_labels({"model_name": model_name})
