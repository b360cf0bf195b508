"""Embeddings: vectors a second through HTTP against TextEmbeddingPipeline alone.

    python -m bench embeddings [--seconds 5] [--rounds 3] [--precision auto] [--server-args '...']

In one run, on the embedded all-MiniLM-L6-v2 (converted into the model cache as the
server does):

- the pipeline alone (no HTTP, in this process while the server idles):
  `embed_documents` of 1, 8 and 32 texts per call, one call after the other: the limit;
- the server (`ovtrio serve --encoder-preload`): 1, 8 and 32 concurrent clients, each
  sending single-text requests one after the other (the server batches what arrives
  together), and one client sending requests of 8 and 32 texts;
- /health latency (p50/p99/max, probed every 50 ms on a new connection) while 32
  embedding clients run beside 4 streaming generations.

Each HTTP figure is printed beside the pipeline's at the same batch size, as a ratio;
the two are measured in turns, `--rounds` times: the medians are printed (and the best
ratio), with the CPU time per embedding of the server and of the benchmark's own
clients (raw keep-alive sockets, requests encoded beforehand: cheap, since they share
the machine's cores with the server), and the mean batch the pipeline saw (from the
server's metrics). `--server-args` passes more flags to the server.
The goal: 32 concurrent single-text requests reach 0.9 of the pipeline's batch of 32.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import trio

from bench.driver import server as servers
from bench.driver.results import Outcome
from bench.driver.server import cpu_seconds, http_request
from bench.driver.stats import percentile

WORDS = (
    "the quick brown fox jumps over a lazy dog while rivers run past old towns and people read books about"
    " mountains forests oceans markets engines music food weather history science and small edge servers"
).split()


def sentence(index: int) -> str:
    """A different sentence of 10-16 words for each index (no cache anywhere to hit)."""
    length = 10 + index % 7
    return " ".join(WORDS[(index * 7 + 3 * k) % len(WORDS)] for k in range(length)) + f" {index}."


class Pipeline:
    """TextEmbeddingPipeline alone, configured as the server configures it."""

    def __init__(self, precision: str) -> None:
        import openvino_genai

        from ovtrio.embedding.embedded import embedded_embedder_folder
        from ovtrio.embedding.kinds import max_input_tokens
        from ovtrio.gguf.cache import default_cache_dir

        folder = embedded_embedder_folder(default_cache_dir())
        config = openvino_genai.TextEmbeddingPipeline.Config()
        config.pooling_type = openvino_genai.TextEmbeddingPipeline.PoolingType.MEAN
        config.normalize = True
        config.max_length = max_input_tokens(folder)
        hints = {} if precision == "auto" else {"INFERENCE_PRECISION_HINT": precision}
        self.pipeline = openvino_genai.TextEmbeddingPipeline(str(folder), "CPU", config, **hints)
        self.pipeline.embed_documents(["warm up"])

    def rate(self, batch: int, seconds: float) -> float:
        """Embeddings a second at `batch` texts a call, one call after the other."""
        done = 0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            self.pipeline.embed_documents([sentence(done + i) for i in range(batch)])
            done += batch
        return done / (time.perf_counter() - started)


def request_bytes(port: int, texts: list[str], encoding: str = "base64") -> bytes:
    """One keep-alive POST /v1/embeddings, encoded once before the clock starts."""
    body = json.dumps({"input": texts, "encoding_format": encoding}).encode()
    head = (
        f"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def read_reply(stream: trio.SocketStream, pending: bytearray) -> None:
    """Read one reply (headers and a Content-Length body) off a keep-alive connection,
    leaving anything after it in `pending`; raise unless it is a 200."""
    while (end := pending.find(b"\r\n\r\n")) < 0:
        data = await stream.receive_some(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        pending += data
    head = bytes(pending[:end])
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(head.decode(errors="replace"))
    length = int(re.search(rb"(?i)\r\ncontent-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
    del pending[: end + 4]
    while len(pending) < length:
        data = await stream.receive_some(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        pending += data
    del pending[:length]


# The benchmark's own CPU seconds spent sending requests and reading replies, kept
# beside each HTTP figure: on 2 cores the load generator takes its share from the server.
async def clients(port: int, concurrency: int, per_request: int, seconds: float, encoding: str = "base64") -> float:
    """Embeddings a second from `concurrency` clients sending `per_request` texts each,
    one request after the other on their own keep-alive connection. The requests are
    encoded beforehand and written to raw sockets: an httpx client cost 1-2 ms of CPU a
    request, as much as the server's HTTP path, on the same two cores."""
    requests = [
        request_bytes(port, [sentence(i * per_request + k) for k in range(per_request)], encoding) for i in range(4096)
    ]
    done = 0
    counter = 0
    deadline = time.perf_counter() + seconds

    async def one_client() -> None:
        nonlocal done, counter
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        pending = bytearray()
        async with stream:
            while time.perf_counter() < deadline:
                counter += 1
                await stream.send_all(requests[counter % len(requests)])
                await read_reply(stream, pending)
                done += per_request

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(one_client)
    return done / (time.perf_counter() - started)


async def health_beside_generation(port: int, client: httpx.AsyncClient, seconds: float) -> list[float]:
    """/health latencies while 32 embedding clients and 4 generation streams run."""
    latencies: list[float] = []

    async def generate() -> None:
        body = {
            "messages": [{"role": "user", "content": "Tell me a story."}],
            "max_tokens": 64,
            "ignore_eos": True,
            "stream": True,
            "model": "SmolLM2-135M-Instruct",
        }
        while True:
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                async for _ in response.aiter_bytes():
                    pass

    async def probe_once() -> None:
        started = time.perf_counter()
        await http_request(port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        latencies.append(time.perf_counter() - started)

    async def probe() -> None:
        async with trio.open_nursery() as probes:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                probes.start_soon(probe_once)
                await trio.sleep(0.05)

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(generate)
        await trio.sleep(1.0)
        nursery.start_soon(clients, port, 32, 1, seconds)
        await probe()
        nursery.cancel_scope.cancel()
    return latencies


# Each HTTP figure: (clients, texts a request, the pipeline's batch size to compare with,
# encoding_format).
CASES = {
    "1 concurrent x 1 text": (1, 1, 1, "base64"),
    "8 concurrent x 1 text": (8, 1, 8, "base64"),
    "32 concurrent x 1 text": (32, 1, 32, "base64"),
    "32 concurrent x 1 text, floats": (32, 1, 32, "float"),
    "1 client x 8 texts": (1, 8, 8, "base64"),
    "1 client x 32 texts": (1, 32, 32, "base64"),
}


@dataclass
class Figures:
    """What the rounds measured for one HTTP case: the rate and the ratio to the
    pipeline measured just before it, each round; the server's and the benchmark's own
    CPU seconds per embedding."""

    rates: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)
    server_cpu: list[float] = field(default_factory=list)
    client_cpu: list[float] = field(default_factory=list)
    batch: list[float] = field(default_factory=list)


async def batches(port: int) -> tuple[float, float]:
    """Inputs computed and batches run so far, from the server's ovtrio_encoder_batch_size
    histogram: their quotient is the batch size the pipeline saw."""
    reply = await http_request(port, b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    found = dict.fromkeys(("sum", "count"), 0.0)
    for line in reply.decode().splitlines():
        for key in found:
            if line.startswith(f"ovtrio_encoder_batch_size_{key}{{"):
                found[key] += float(line.rsplit(" ", 1)[1])
    return found["sum"], found["count"]


async def server_rates(
    precision: str, seconds: float, rounds: int, server_args: list[str]
) -> tuple[dict[str, Figures], dict[int, list[float]], list[float]]:
    """The HTTP figures and the pipeline's, measured in turns (`rounds` times each): on a
    shared machine the load drifts, and turns expose both to it alike."""
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / "ovtrio-embeddings-bench.log", "w")
    flags = ["--encoder-preload", "--encoder-inference-precision", precision, "--log-level", "warning", *server_args]
    server = servers.start(flags, log=log)
    port, process = server.port, server.process
    try:
        with trio.fail_after(300):
            await servers.wait_ready(port, process)
        await clients(port, 1, 1, 1.0)  # warm: the embedder loaded
        pipeline = Pipeline(precision)
        figures = {name: Figures() for name in CASES}
        reference: dict[int, list[float]] = {}
        for _ in range(rounds):
            for name, (concurrency, per_request, batch, encoding) in CASES.items():
                pipeline_rate = pipeline.rate(batch, seconds)
                reference.setdefault(batch, []).append(pipeline_rate)
                inputs_before, batches_before = await batches(port)
                server_before, client_before = cpu_seconds(process.pid), time.process_time()
                started = time.perf_counter()
                rate = await clients(port, concurrency, per_request, seconds, encoding)
                embeddings = rate * (time.perf_counter() - started)
                figure = figures[name]
                figure.rates.append(rate)
                figure.ratios.append(rate / pipeline_rate)
                figure.server_cpu.append((cpu_seconds(process.pid) - server_before) / embeddings)
                figure.client_cpu.append((time.process_time() - client_before) / embeddings)
                inputs, count = await batches(port)
                figure.batch.append((inputs - inputs_before) / max(1.0, count - batches_before))
        del pipeline
        limits = httpx.Limits(max_connections=8, max_keepalive_connections=8)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120, limits=limits) as client:
            health = await health_beside_generation(port, client, seconds * 2)
        return figures, reference, health
    finally:
        servers.stop(process)
        log.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds each measurement runs")
    parser.add_argument("--precision", default="auto", choices=["auto", "f32", "bf16"])
    parser.add_argument("--rounds", type=int, default=3, help="turns of every measurement; medians are printed")
    parser.add_argument("--server-args", default="", help="more arguments for `ovtrio serve`, in one string")


def run(args: argparse.Namespace) -> Outcome:
    figures, reference, health = trio.run(
        server_rates, args.precision, args.seconds, args.rounds, shlex.split(args.server_args)
    )
    median = statistics.median
    print(
        f"{'':38} {'embeddings/s':>12} {'ratio':>6} {'best':>5} {'server CPU':>10} {'bench CPU':>9} {'batch':>5}"
        "  (medians of the rounds; CPU in ms an embedding; batch: mean inputs a pipeline call)"
    )
    for name, figure in figures.items():
        print(
            f"HTTP {name:33} {median(figure.rates):12.0f} {median(figure.ratios):6.2f} {max(figure.ratios):5.2f}"
            f" {1000 * median(figure.server_cpu):10.2f} {1000 * median(figure.client_cpu):9.2f}"
            f" {median(figure.batch):5.1f}"
        )
    rates = {batch: median(values) for batch, values in reference.items()}
    print(f"pipeline batch 1 / 8 / 32: {rates[1]:.0f} / {rates[8]:.0f} / {rates[32]:.0f} embeddings/s")
    ms = sorted(1000 * value for value in health)
    print(
        f"/health beside 4 generation streams and 32 embedding clients: p50 {statistics.median(ms):.1f} ms,"
        f" p99 {percentile(ms, 99):.1f} ms, max {ms[-1]:.1f} ms ({len(ms)} probes)"
    )
    summary = {f"{name}: ratio to the pipeline": median(figure.ratios) for name, figure in figures.items()}
    summary |= {f"{name}: embeddings/s": median(figure.rates) for name, figure in figures.items()}
    summary |= {f"pipeline, batch {batch}: embeddings/s": rate for batch, rate in rates.items()}
    summary["/health p99 ms beside generation"] = percentile(ms, 99)
    samples = {
        "http": {name: vars(figure) for name, figure in figures.items()},
        "pipeline": reference,
        "health_s": health,
    }
    return Outcome(summary, samples)
