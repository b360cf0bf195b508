"""/metrics under vLLM's names, as the Gateway API Inference Extension's endpoint picker
and vLLM's dashboards read them, moving as a known workload says they must.

Tests run one after another on the shared server, so the difference of a counter
before and after a test's own requests is exactly what those requests did. Requests
use `ignore_eos` with `max_tokens` m, so each generates exactly m tokens, or force their
end ("stop") through the API; nothing here depends on what the model writes.
"""

from __future__ import annotations

import time
from itertools import islice

import httpx
from prometheus_client.parser import text_string_to_metric_families

import loopback
from conftest import MODEL, sample_value
from helpers import ENDS_BY_ITSELF, chat, chat_body, complete, completion_body, pick_stop_word, post
from ovtrio.scheduler import waiting_requests

LABELS = {"model_name": MODEL, "engine": "0"}

# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
]  # fmt: skip
TOKEN_LATENCY_BUCKETS = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
]  # fmt: skip
REQUEST_LATENCY_BUCKETS = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
]  # fmt: skip

HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": TTFT_BUCKETS,
    "vllm:inter_token_latency_seconds": TOKEN_LATENCY_BUCKETS,
    "vllm:request_time_per_output_token_seconds": TOKEN_LATENCY_BUCKETS,
    "vllm:e2e_request_latency_seconds": REQUEST_LATENCY_BUCKETS,
    "vllm:request_queue_time_seconds": REQUEST_LATENCY_BUCKETS,
    "vllm:request_prompt_tokens": None,
    "vllm:request_generation_tokens": None,
}


class Scrape:
    """One /metrics exposition, read with prometheus_client's parser."""

    def __init__(self, base_url: str) -> None:
        self.text = loopback.get(base_url + "/metrics", timeout=10).text
        self.families = {family.name: family for family in text_string_to_metric_families(self.text)}

    def __call__(self, name: str, **labels: str) -> float:
        """A vLLM series of the served model (model_name and engine labels added)."""
        return sample_value(self.text, name, **LABELS, **labels)

    def plain(self, name: str, **labels: str) -> float:
        return sample_value(self.text, name, **labels)


def scrape(server) -> Scrape:
    return Scrape(server.base_url)


def rose(before: Scrape, after: Scrape, name: str, **labels: str) -> float:
    return after(name, **labels) - before(name, **labels)


def test_the_names_types_and_labels_a_fleet_reads(server):
    metrics = scrape(server)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert metrics.families[name].type == "gauge", name
        assert [s.labels for s in metrics.families[name].samples] == [LABELS]
    for name in ("vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success"):
        assert metrics.families[name].type == "counter", name
    reasons = {s.labels["finished_reason"] for s in metrics.families["vllm:request_success"].samples}
    assert reasons == {"stop", "length", "abort", "error"}
    for name, buckets in HISTOGRAMS.items():
        assert metrics.families[name].type == "histogram", name
        bounds = [float(s.labels["le"]) for s in metrics.families[name].samples if s.name == name + "_bucket"]
        assert bounds[-1] == float("inf")
        if buckets is not None:
            assert bounds[:-1] == buckets, name
    # Token counts: 1, 2, 5, 10, ... up to the model's context length (8192).
    bounds = [float(s.labels["le"]) for s in metrics.families["vllm:request_prompt_tokens"].samples if "le" in s.labels]
    assert bounds[:5] == [1, 2, 5, 10, 20] and bounds[-2] == 5000
    assert metrics.families["ovtrio_http_responses"].type == "counter"


def test_a_known_workload_moves_the_histograms_exactly(server):
    k, m = 3, 6
    before = scrape(server)
    prompts = [
        complete(server.base_url, prompt=f"Count to {i}:", max_tokens=m, ignore_eos=True, temperature=0).usage[
            "prompt_tokens"
        ]
        for i in range(k)
    ]
    after = scrape(server)

    assert rose(before, after, "vllm:request_generation_tokens_count") == k
    assert rose(before, after, "vllm:request_generation_tokens_sum") == k * m
    # m = 6 falls in the bucket up to 10, not in the one up to 5.
    assert rose(before, after, "vllm:request_generation_tokens_bucket", le="5.0") == 0
    assert rose(before, after, "vllm:request_generation_tokens_bucket", le="10.0") == k
    assert rose(before, after, "vllm:request_prompt_tokens_count") == k
    assert rose(before, after, "vllm:request_prompt_tokens_sum") == sum(prompts)
    assert rose(before, after, "vllm:generation_tokens_total") == k * m
    assert rose(before, after, "vllm:prompt_tokens_total") == sum(prompts)
    # One source of truth: the ovtrio_ name moves with the vLLM one.
    assert after.plain("ovtrio_generated_tokens_total") - before.plain("ovtrio_generated_tokens_total") == k * m
    assert rose(before, after, "vllm:request_success_total", finished_reason="length") == k
    assert rose(before, after, "vllm:request_success_total", finished_reason="stop") == 0

    for name in (
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_time_per_output_token_seconds",
    ):
        assert rose(before, after, name + "_count") == k, name
    # One gap per engine step after the first token: m - 1 per request.
    assert rose(before, after, "vllm:inter_token_latency_seconds_count") == k * (m - 1)
    ttft = rose(before, after, "vllm:time_to_first_token_seconds_sum")
    e2e = rose(before, after, "vllm:e2e_request_latency_seconds_sum")
    gaps = rose(before, after, "vllm:inter_token_latency_seconds_sum")
    assert 0 < ttft < e2e
    # Each request's last token came after its first by the sum of its gaps.
    assert abs(e2e - ttft - gaps) < 1e-6
    queue = rose(before, after, "vllm:request_queue_time_seconds_sum")
    assert 0 <= queue < ttft


def test_finish_reasons(server):
    # Ended by the model's end-of-sequence token, forced by a JSON schema.
    before = scrape(server)
    assert chat(server.base_url, **ENDS_BY_ITSELF, temperature=0).finish_reason == "stop"
    after = scrape(server)
    assert rose(before, after, "vllm:request_success_total", finished_reason="stop") == 1
    assert rose(before, after, "vllm:request_success_total", finished_reason="length") == 0
    assert rose(before, after, "vllm:e2e_request_latency_seconds_count") == 1

    # Ended by a stop string taken from an earlier output of the same request.
    text = complete(server.base_url, prompt="Once upon a time", max_tokens=24, ignore_eos=True, temperature=0).text
    stop, _ = pick_stop_word(text)
    before = scrape(server)
    stopped = complete(
        server.base_url, prompt="Once upon a time", max_tokens=24, ignore_eos=True, temperature=0, stop=[stop]
    )
    after = scrape(server)
    assert stopped.finish_reason == "stop"
    assert rose(before, after, "vllm:request_success_total", finished_reason="stop") == 1
    assert rose(before, after, "vllm:request_success_total", finished_reason="length") == 0
    assert rose(before, after, "vllm:request_generation_tokens_sum") == stopped.usage["completion_tokens"]

    # Two choices: each is counted, as vLLM counts each of its engine requests.
    before = scrape(server)
    complete(server.base_url, prompt="Hi", max_tokens=3, ignore_eos=True, n=2)
    after = scrape(server)
    assert rose(before, after, "vllm:request_success_total", finished_reason="length") == 2
    assert rose(before, after, "vllm:request_generation_tokens_sum") == 6


def wait_until(condition, within: float) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_running_waiting_and_kv_cache_while_a_request_runs_and_after_it_leaves(server):
    before = scrape(server)
    assert before("vllm:num_requests_running") == 0
    assert before("vllm:num_requests_waiting") == 0
    assert before("vllm:kv_cache_usage_perc") == 0
    body = chat_body("Count to a thousand.", max_tokens=4000, ignore_eos=True, stream=True)
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            lines = response.iter_lines()  # kept open: closing it would close the response
            assert len(list(islice((line for line in lines if line.startswith("data: ")), 3))) == 3
            during = scrape(server)
            assert during("vllm:num_requests_running") == 1
            assert during("vllm:num_requests_waiting") == 0
            assert 0 < during("vllm:kv_cache_usage_perc") <= 1
            # The same number as the ovtrio_ gauge, as a fraction.
            assert during("vllm:kv_cache_usage_perc") * 100 == during.plain("ovtrio_kv_cache_usage_percent")
    # The client left: the request ends as aborted, and the engine is empty again.
    wait_until(
        lambda: (
            scrape(server)("vllm:request_success_total", finished_reason="abort")
            > before("vllm:request_success_total", finished_reason="abort")
        ),
        within=10,
    )
    wait_until(lambda: server.metric("ovtrio_engine_requests") == 0, within=10)
    after = scrape(server)
    assert after("vllm:num_requests_running") == 0
    assert after("vllm:num_requests_waiting") == 0
    assert after("vllm:kv_cache_usage_perc") == 0
    assert rose(before, after, "vllm:request_success_total", finished_reason="abort") == 1
    assert rose(before, after, "vllm:time_to_first_token_seconds_count") == 1
    assert rose(before, after, "vllm:e2e_request_latency_seconds_count") == 0


def test_waiting_counts_queued_requests_and_those_the_engine_did_not_schedule():
    assert waiting_requests(queued=0, engine_requests=0, engine_scheduled=0) == 0
    assert waiting_requests(queued=2, engine_requests=5, engine_scheduled=3) == 4
    # The last step may have scheduled requests that finished in it.
    assert waiting_requests(queued=1, engine_requests=0, engine_scheduled=2) == 1


def test_http_responses_by_route_and_status(server):
    def responses(metrics: Scrape, method: str, route: str, status: int) -> float:
        try:
            return metrics.plain("ovtrio_http_responses_total", method=method, route=route, status=str(status))
        except KeyError:
            return 0.0

    before = scrape(server)
    assert post(server.base_url, "/v1/chat/completions", content="{").status_code == 400
    assert post(server.base_url, "/v1/completions", completion_body(model="no-such-model")).status_code == 404
    assert loopback.get(server.base_url + "/v1/no-such-route", timeout=10).status_code == 404
    assert chat(server.base_url, "/v3/chat/completions", max_tokens=4, ignore_eos=True).finish_reason == "length"
    with loopback.stream(
        "POST", server.base_url + "/v3/chat/completions", json=chat_body(max_tokens=4, stream=True)
    ) as r:
        assert r.status_code == 200
        assert r.read().endswith(b"data: [DONE]\n\n")
    after = scrape(server)

    assert (
        responses(after, "POST", "/v1/chat/completions", 400) - responses(before, "POST", "/v1/chat/completions", 400)
        == 1
    )
    assert responses(after, "POST", "/v1/completions", 404) - responses(before, "POST", "/v1/completions", 404) == 1
    assert responses(after, "GET", "unmatched", 404) - responses(before, "GET", "unmatched", 404) == 1
    # One unary and one streamed 200, each counted once.
    assert (
        responses(after, "POST", "/v3/chat/completions", 200) - responses(before, "POST", "/v3/chat/completions", 200)
        == 2
    )


def test_made_up_methods_count_as_other_and_add_no_series(server):
    def series(metrics: Scrape) -> dict[tuple[str, ...], float]:
        family = metrics.families["ovtrio_http_responses"]
        return {
            (sample.labels["method"], sample.labels["route"], sample.labels["status"]): sample.value
            for sample in family.samples
            if sample.name == "ovtrio_http_responses_total"
        }

    for method in ("BREW", "PROPFIND"):  # a series for "other" at each status they get, once
        loopback.request(method, server.base_url + "/v1/models", timeout=10)
        loopback.request(method, server.base_url + "/nowhere", timeout=10)
    scrape(server)  # and one for the scrapes themselves
    before = series(scrape(server))
    statuses = {
        loopback.request(f"M{i}", server.base_url + path, timeout=10).status_code
        for i in range(100)
        for path in ("/v1/models", "/nowhere")
    }
    after = series(scrape(server))
    assert statuses <= {404, 405}
    assert set(after) == set(before), set(after) ^ set(before)
    others = sum(value - before[labels] for labels, value in after.items() if labels[0] == "other")
    assert others == 200
    assert {labels[0] for labels in after} <= {"GET", "HEAD", "POST", "DELETE", "OPTIONS", "other"}


def test_a_model_loaded_at_start_is_counted_as_loads_are(server):
    """Loads minus unloads is the number loaded, for a model loaded at start too (its
    load was not counted, its unloads were)."""
    text = loopback.get(server.base_url + "/metrics", timeout=10).text

    def value(name: str, **labels: str) -> float:
        try:
            return sample_value(text, name, **labels)
        except KeyError:
            return 0.0

    unloads = sum(
        value("ovtrio_model_unloads_total", model_name=MODEL, reason=reason) for reason in ("request", "idle", "lru")
    )
    loads = value("ovtrio_model_loads_total", model_name=MODEL)
    assert loads >= 1 and value("ovtrio_model_load_seconds_count", model_name=MODEL) == loads
    assert loads - unloads == value("ovtrio_model_loaded", model_name=MODEL) == 1


def test_forgetting_a_model_removes_each_of_its_series_and_keeps_the_others():
    """What ServerMetrics.forget removes when the registry forgets a model: the series
    of every family made for it (request histograms, finish reasons, speculation, images,
    loads and unloads, an encoder's), and no other model's."""
    from prometheus_client import generate_latest

    from ovtrio.serving.metrics import ServerMetrics

    metrics = ServerMetrics()
    for name in ("gone", "kept"):
        observer = metrics.for_model(name, 512, speculative=True)
        observer.finished("stop", 3, 2, 0.5, 0.1)
        observer.speculated(2, 1)
        observer.image_prepared(0.01)
        metrics.lifecycle.loaded(name, 1.0)
        metrics.lifecycle.load_failed(name)
        metrics.lifecycle.unloaded(name, "idle")
        metrics.encoders.for_model(name, "embedding").finished(1, 4)

    metrics.forget("gone")

    def models_named() -> dict[str, set[str]]:
        exposition = generate_latest(metrics.registry).decode()
        names: dict[str, set[str]] = {}
        for family in text_string_to_metric_families(exposition):
            for sample in family.samples:
                if "model_name" in sample.labels:
                    names.setdefault(sample.labels["model_name"], set()).add(family.name)
        return names

    named = models_named()
    assert set(named) == {"kept"} and len(named["kept"]) >= 20, named
    # A model of that name found later starts from zero.
    metrics.for_model("gone", 512).finished("length", 3, 2, 0.5, 0.1)
    exposition = generate_latest(metrics.registry).decode()
    assert sample_value(exposition, "vllm:request_success_total", model_name="gone", finished_reason="length") == 1
    assert sample_value(exposition, "vllm:request_success_total", model_name="kept", finished_reason="stop") == 1
