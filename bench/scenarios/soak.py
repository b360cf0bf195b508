"""A long mixed load against one server: does every request succeed, and does the
server stay the same size?

    python -m bench soak [--minutes 60] [--clients 4] [--server-arg=--flag ...]

Starts one `ovtrio serve` with two generation models through `--config` (the embedded
SmolLM2-135M-Instruct, and the tiny VLM test fixture as `vlm`, tests/tiny_vlm.py, with
a KV cache of 256 blocks), the embedded embedder, and the random-weight cross-encoder
test fixture as `--rerank-model` (tests/encoder_fixtures.py). Then `--clients` clients, each sending one
request after another, go round the request kinds below (each starting at another kind)
for `--minutes`; every request is bounded (at most 32 new tokens, a few inputs):

- chat_stream: a streamed chat completion (the official `openai` SDK);
- completion: a completions request, sampled with a seed;
- responses: a Responses request over HTTP, stored, then a second one chained to it
  with `previous_response_id`;
- responses_stream: a streamed Responses request;
- responses_ws: a Responses request over its WebSocket (`responses.connect()`);
- messages, messages_stream: the Messages API (the `anthropic` SDK), unary and streamed;
- structured: a chat completion with a `json_schema` response format, whose reply must
  parse and validate when it ends by itself;
- embeddings: three texts; rerank: a query and three longer documents;
- image_chat, image_responses, image_messages: one PNG (a base64 data URL) to the VLM
  through chat completions, the Responses API and the Messages API.

A request that fails (an HTTP error, a dropped connection, a stream without its end, a
reply of the wrong shape) counts as an error of its kind and reason; a structured reply
cut by `max_tokens` is counted apart, as a length, not an error. Every `--rss-every`
seconds the server's resident memory (RSS) is read. The run prints the requests and
errors of each kind (the goal: 0 errors), the latency of each kind, and the RSS slope
over the last half of the run (least squares, MB per minute; the goal: flat); the
result keeps every RSS sample.

RSS rises by most of the KV cache's size (`cache_size`, 1 GB) in the first minutes: the
engine touches its blocks as prompts first use them, and the prefix cache keeps them
used. Only once each has been used once does RSS say whether anything else grows, so
the slope is taken over the last half of a long run.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.driver import server as servers
from bench.driver.hardware import cpu_name
from bench.driver.results import Outcome
from bench.driver.server import Server, resident_mb
from bench.driver.stats import percentile
from bench.scenarios.images import png

# The test fixtures (tiny_vlm, encoder_fixtures) are imported by module name, when the
# soak starts: they and the SDKs take seconds to import, which `--help` need not wait for.
TESTS = Path(__file__).resolve().parents[2] / "tests"

MODEL = "SmolLM2-135M-Instruct"
VLM = "vlm"
EMBEDDER = "all-MiniLM-L6-v2"
RERANKER = "reranker"
TOKENS = 32
TOPICS = ["a lighthouse", "a fox", "the sea", "a train", "a garden", "a comet", "a violin", "a bakery"]
ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}, "confidence": {"type": "integer"}},
    "required": ["answer", "confidence"],
    "additionalProperties": False,
}


class Failed(Exception):
    """A reply of the wrong shape: the reason is what the error is counted under."""


@dataclass
class Tally:
    """What the clients saw, shared between their threads."""

    requests: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    first_error: dict[str, str] = field(default_factory=dict)  # one message of each error, for a diagnosis
    lengths: Counter[str] = field(default_factory=Counter)
    seconds: dict[str, list[float]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, kind: str, seconds: float, error: BaseException | None) -> None:
        with self.lock:
            self.requests[kind] += 1
            self.seconds.setdefault(kind, []).append(seconds)
            if error is not None:
                key = f"{kind}: {reason(error)}"
                self.errors[key] += 1
                self.first_error.setdefault(key, str(error)[:300])


def reason(error: BaseException) -> str:
    import anthropic
    import openai

    if isinstance(error, (openai.APIStatusError, anthropic.APIStatusError)):
        return f"HTTP {error.status_code}"
    if isinstance(error, httpx.HTTPStatusError):
        return f"HTTP {error.response.status_code}"
    if isinstance(error, Failed):
        return str(error).split(":", 1)[0]
    return type(error).__name__


class Kinds:
    """The request kinds: each method sends one request (or a chained pair) and raises
    on anything but the reply it should get."""

    def __init__(self, base_url: str, tally: Tally, image_urls: list[str]) -> None:
        import anthropic
        import openai

        self.base_url = base_url
        self.tally = tally
        self.images = image_urls
        self.openai = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
        self.claude = anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
        self.http = httpx.Client(base_url=base_url, timeout=120)

    def close(self) -> None:
        self.openai.close()
        self.claude.close()
        self.http.close()

    def all(self) -> list[Callable[[int], None]]:
        return [
            self.chat_stream,
            self.completion,
            self.responses,
            self.responses_stream,
            self.responses_ws,
            self.messages,
            self.messages_stream,
            self.structured,
            self.embeddings,
            self.rerank,
            self.image_chat,
            self.image_responses,
            self.image_messages,
        ]

    def story(self, n: int) -> str:
        return f"Tell me a short story about {TOPICS[n % len(TOPICS)]}."

    def image(self, n: int) -> str:
        return self.images[n % len(self.images)]

    def chat_stream(self, n: int) -> None:
        stream = self.openai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": self.story(n)}], max_tokens=TOKENS, stream=True
        )
        ends = [chunk.choices[0].finish_reason for chunk in stream if chunk.choices and chunk.choices[0].finish_reason]
        if ends not in (["stop"], ["length"]):
            raise Failed(f"no end: finish reasons {ends}")

    def completion(self, n: int) -> None:
        reply = self.openai.completions.create(
            model=MODEL, prompt=f"Once upon a time, {TOPICS[n % len(TOPICS)]}", max_tokens=TOKENS, seed=n
        )
        if reply.choices[0].finish_reason not in ("stop", "length"):
            raise Failed(f"no end: {reply.choices[0].finish_reason}")

    def responses(self, n: int) -> None:
        first = self.openai.responses.create(model=MODEL, input=self.story(n), max_output_tokens=TOKENS)
        second = self.openai.responses.create(
            model=MODEL, input="And then?", previous_response_id=first.id, max_output_tokens=TOKENS
        )
        if {first.status, second.status} - {"completed", "incomplete"}:
            raise Failed(f"status: {first.status}, {second.status}")

    def responses_stream(self, n: int) -> None:
        # (The SDK's responses.stream() wants `response.completed`, and a reply cut by
        # max_output_tokens ends with `response.incomplete`, as OpenAI's do.)
        events = self.openai.responses.create(model=MODEL, input=self.story(n), max_output_tokens=TOKENS, stream=True)
        ends = [event.type for event in events if event.type in ("response.completed", "response.incomplete")]
        if len(ends) != 1:
            raise Failed(f"no end: {ends}")

    def responses_ws(self, n: int) -> None:
        with self.openai.responses.connect() as connection:
            connection.response.create(model=MODEL, input=self.story(n), max_output_tokens=TOKENS, store=False)
            for event in connection:
                if event.type == "error":
                    raise Failed(f"error event: {event}")
                if event.type in ("response.completed", "response.incomplete"):
                    return
        raise Failed("socket closed: before the response ended")

    def messages(self, n: int) -> None:
        reply = self.claude.messages.create(
            model=MODEL, max_tokens=TOKENS, messages=[{"role": "user", "content": self.story(n)}]
        )
        if reply.stop_reason not in ("end_turn", "max_tokens"):
            raise Failed(f"stop reason: {reply.stop_reason}")

    def messages_stream(self, n: int) -> None:
        with self.claude.messages.stream(
            model=MODEL, max_tokens=TOKENS, messages=[{"role": "user", "content": self.story(n)}]
        ) as stream:
            reply = stream.get_final_message()
        if reply.stop_reason not in ("end_turn", "max_tokens"):
            raise Failed(f"stop reason: {reply.stop_reason}")

    def structured(self, n: int) -> None:
        reply = self.openai.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Is {TOPICS[n % len(TOPICS)]} blue? Answer in JSON."}],
            max_tokens=TOKENS,
            response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}},
        )
        choice = reply.choices[0]
        if choice.finish_reason == "length":
            with self.tally.lock:
                self.tally.lengths["structured"] += 1
            return
        import jsonschema

        try:
            jsonschema.validate(json.loads(choice.message.content or ""), ANSWER)
        except (ValueError, jsonschema.ValidationError) as error:
            raise Failed(f"invalid JSON: {error}") from None

    def embeddings(self, n: int) -> None:
        texts = [self.story(n + i) for i in range(3)]
        vectors = self.openai.embeddings.create(model=EMBEDDER, input=texts).data
        if [len(vector.embedding) for vector in vectors] != [384] * 3:
            raise Failed(f"vectors: {[len(vector.embedding) for vector in vectors]}")

    def rerank(self, n: int) -> None:
        # Documents longer than the query: a query longer than its documents, with three or
        # more of them, has corrupted the server's memory (openvino_tokenizers 2026.4.1's
        # step that combines the pairs).
        documents = [f"{self.story(n + i)} It was a long day, and the night was longer still." for i in range(3)]
        reply = self.http.post("/v1/rerank", json={"model": RERANKER, "query": "a story", "documents": documents})
        reply.raise_for_status()
        if sorted(result["index"] for result in reply.json()["results"]) != [0, 1, 2]:
            raise Failed(f"results: {reply.text[:200]}")

    def image_chat(self, n: int) -> None:
        content = [{"type": "text", "text": "Describe it."}, {"type": "image_url", "image_url": {"url": self.image(n)}}]
        reply = self.openai.chat.completions.create(
            model=VLM, messages=[{"role": "user", "content": content}], max_tokens=8
        )
        if reply.choices[0].finish_reason not in ("stop", "length"):
            raise Failed(f"no end: {reply.choices[0].finish_reason}")

    def image_responses(self, n: int) -> None:
        content = [{"type": "input_text", "text": "Describe it."}, {"type": "input_image", "image_url": self.image(n)}]
        reply = self.openai.responses.create(
            model=VLM, input=[{"role": "user", "content": content}], max_output_tokens=8, store=False
        )
        if reply.status not in ("completed", "incomplete"):
            raise Failed(f"status: {reply.status}")

    def image_messages(self, n: int) -> None:
        data = self.image(n).split(",", 1)[1]
        source = {"type": "base64", "media_type": "image/png", "data": data}
        content = [{"type": "text", "text": "Describe it."}, {"type": "image", "source": source}]
        reply = self.claude.messages.create(model=VLM, max_tokens=8, messages=[{"role": "user", "content": content}])
        if reply.stop_reason not in ("end_turn", "max_tokens"):
            raise Failed(f"stop reason: {reply.stop_reason}")


def client(kinds: Kinds, offset: int, deadline: float) -> None:
    """One client: the kinds in turn from `offset`, one request after another."""
    each = kinds.all()
    n = offset
    while time.monotonic() < deadline:
        kind = each[n % len(each)]
        started = time.perf_counter()
        error: BaseException | None = None
        try:
            kind(n)
        except Exception as exc:  # noqa: BLE001 - every failure is a result here
            error = exc
        kinds.tally.record(kind.__name__, time.perf_counter() - started, error)
        n += 1


def sample_rss(server: Server, every: float, stop: threading.Event, samples: list[tuple[float, float]]) -> None:
    started = time.monotonic()
    while not stop.is_set():
        samples.append((time.monotonic() - started, resident_mb(server.pid)))
        stop.wait(every)


def slope_mb_per_minute(samples: list[tuple[float, float]], since: float) -> float:
    """The least-squares slope of RSS against time over the samples from `since` seconds."""
    late = [(t / 60, mb) for t, mb in samples if t >= since]
    if len(late) < 2:
        return float("nan")
    return statistics.linear_regression([t for t, _ in late], [mb for _, mb in late]).slope


def prepare_models(folder: Path) -> list[str]:
    """The fixtures and the config file; the server's flags that serve them."""
    sys.path.insert(0, str(TESTS))
    import tiny_vlm
    from encoder_fixtures import write_reranker

    vlm = tiny_vlm.build(folder / "tiny-vlm")
    reranker = write_reranker(folder / RERANKER)
    config = folder / "models.json"
    # The VLM's KV cache is kept small: the engine's cache is touched block by block as
    # prompts first use it (RSS rises by its size over the first minutes, until every
    # block has been used once), and 1 GB of the tiny VLM's would take hours to fill.
    models = [{"served_model_name": MODEL}, {"served_model_name": VLM, "model": str(vlm), "num_kv_blocks": 256}]
    config.write_text(json.dumps({"models": models}))
    return ["--config", str(config), "--rerank-model", str(reranker), "--log-level", "warning"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rss-every", type=float, default=5.0, help="seconds between RSS samples")
    parser.add_argument("--server-arg", action="append", default=[], help="extra `ovtrio serve` flag (repeatable)")


def run(options: argparse.Namespace) -> Outcome:
    folder = Path(tempfile.mkdtemp(prefix="bench-soak-"))
    server = servers.start([*prepare_models(folder), *options.server_arg])
    servers.ready_by_http(server.port, lambda: server.process.poll() is None)
    tally = Tally()
    images = ["data:image/png;base64," + base64.b64encode(png(seed, 64)).decode() for seed in range(4)]
    samples: list[tuple[float, float]] = []
    stop = threading.Event()
    kinds = Kinds(server.base_url, tally, images)
    duration = options.minutes * 60
    try:
        sampler = threading.Thread(target=sample_rss, args=(server, options.rss_every, stop, samples))
        sampler.start()
        deadline = time.monotonic() + duration
        clients = [threading.Thread(target=client, args=(kinds, i * 3, deadline)) for i in range(options.clients)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join()
        stop.set()
        sampler.join()
        alive = server.process.poll() is None
    finally:
        kinds.close()
        servers.stop(server.process)

    slope = slope_mb_per_minute(samples, duration / 2)
    errors = sum(tally.errors.values())
    cpu = cpu_name()
    print(f"soak: {options.minutes:g} min, {options.clients} clients, {cpu}, {os.cpu_count()} cores")
    print(f"{'kind':<17} {'requests':>8} {'errors':>6} {'p50 ms':>8} {'p99 ms':>8}")
    for kind in (kind.__name__ for kind in kinds.all()):
        seconds = tally.seconds.get(kind, [])
        failed = sum(count for key, count in tally.errors.items() if key.startswith(kind + ":"))
        print(
            f"{kind:<17} {tally.requests[kind]:>8} {failed:>6}"
            f" {1000 * percentile(seconds, 50):>8.0f} {1000 * percentile(seconds, 99):>8.0f}"
        )
    print(f"requests: {sum(tally.requests.values())}; errors: {errors} (goal: 0); server alive at the end: {alive}")
    for key, count in tally.errors.most_common():
        print(f"  {count} x {key}: {tally.first_error[key]}")
    if tally.lengths:
        print(f"structured replies cut by max_tokens (not errors): {tally.lengths['structured']}")
    first, last = samples[0][1], samples[-1][1]
    print(
        f"RSS: {first:.0f} MB at the start, {max(mb for _, mb in samples):.0f} MB at most, {last:.0f} MB at the end;"
        f" slope over the last half {slope:+.2f} MB/min ({len(samples)} samples every {options.rss_every:g} s)"
    )
    latency = {
        kind: {"p50": 1000 * percentile(seconds, 50), "p99": 1000 * percentile(seconds, 99)}
        for kind, seconds in tally.seconds.items()
    }
    summary: dict[str, float | str] = {
        "minutes": options.minutes,
        "requests": sum(tally.requests.values()),
        "errors": errors,
        "server alive at the end": "yes" if alive else "NO",
        "RSS slope over the last half MB/min": slope,
        "RSS at the start MB": first,
        "RSS at the end MB": last,
    }
    for kind, figures in latency.items():
        summary[f"{kind} p99 ms"] = figures["p99"]
    samples = {
        "cpu": cpu,
        "requests": dict(tally.requests),
        "errors": dict(tally.errors),
        "error_messages": tally.first_error,
        "structured_cut_by_max_tokens": tally.lengths["structured"],
        "latency_ms": latency,
        "server_alive_at_end": alive,
        "rss_mb": samples,
    }
    return Outcome(summary, samples)
