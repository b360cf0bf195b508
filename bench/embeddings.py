"""Embeddings benchmark: vectors a second through HTTP against TextEmbeddingPipeline alone.

    python bench/embeddings.py [--seconds 5] [--precision auto]

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
the two are measured in turns, `--rounds` times, and the best of each kept.
The goal: 32 concurrent single-text requests reach 0.9 of the pipeline's batch of 32.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from responsiveness import http_request
from serving import cpu_seconds, free_port, percentile, wait_ready

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
        from ovtrio.model.cache import default_cache_dir

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


async def clients(client: httpx.AsyncClient, concurrency: int, per_request: int, seconds: float) -> float:
    """Embeddings a second from `concurrency` clients sending `per_request` texts each."""
    done = 0
    counter = 0
    deadline = time.perf_counter() + seconds

    async def one_client() -> None:
        nonlocal done, counter
        while time.perf_counter() < deadline:
            counter += per_request
            texts = [sentence(counter + i) for i in range(per_request)]
            response = await client.post("/v1/embeddings", json={"input": texts, "encoding_format": "base64"})
            response.raise_for_status()
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
        nursery.start_soon(clients, client, 32, 1, seconds)
        await probe()
        nursery.cancel_scope.cancel()
    return latencies


# Each HTTP figure and the pipeline figure at the same batch size.
CASES = {
    "1 concurrent x 1 text": (1, 1, 1),
    "8 concurrent x 1 text": (8, 1, 8),
    "32 concurrent x 1 text": (32, 1, 32),
    "1 client x 8 texts": (1, 8, 8),
    "1 client x 32 texts": (1, 32, 32),
}


# The server's CPU time per embedding in the run kept for each HTTP case: what the HTTP
# path costs beside the model, whatever share of the CPU the machine gives the server.
CPU_PER_EMBEDDING: dict[str, float] = {}


async def server_rates(
    precision: str, seconds: float, rounds: int
) -> tuple[dict[str, float], dict[int, float], list[float]]:
    """The HTTP figures and the pipeline's, measured in turns (`rounds` times each, the
    best kept): on a shared machine the load drifts, and turns expose both to it alike."""
    port = free_port()
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / "ovtrio-embeddings-bench.log", "w")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ovtrio",
            "serve",
            "--port",
            str(port),
            "--encoder-preload",
            "--encoder-inference-precision",
            precision,
            "--log-level",
            "warning",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        with trio.fail_after(300):
            await wait_ready(port, process)
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120, limits=limits) as client:
            await clients(client, 1, 1, 1.0)  # warm: the embedder loaded, connections open
            pipeline = Pipeline(precision)
            rates: dict[str, float] = {}
            reference: dict[int, float] = {}
            for _ in range(rounds):
                for name, (concurrency, per_request, batch) in CASES.items():
                    reference[batch] = max(reference.get(batch, 0.0), pipeline.rate(batch, seconds))
                    cpu_before, started = cpu_seconds(process.pid), time.perf_counter()
                    rate = await clients(client, concurrency, per_request, seconds)
                    cpu = (cpu_seconds(process.pid) - cpu_before) / (rate * (time.perf_counter() - started))
                    if rate > rates.get(name, 0.0):
                        rates[name] = rate
                        CPU_PER_EMBEDDING[name] = cpu
            del pipeline
            health = await health_beside_generation(port, client, seconds * 2)
        return rates, reference, health
    finally:
        process.terminate()
        process.wait(timeout=60)
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds each measurement runs")
    parser.add_argument("--precision", default="auto", choices=["auto", "f32", "bf16"])
    parser.add_argument("--rounds", type=int, default=2, help="turns of every measurement; the best is kept")
    args = parser.parse_args()
    rates, reference, health = trio.run(server_rates, args.precision, args.seconds, args.rounds)
    print(f"{'':34} {'embeddings/s':>12} {'pipeline':>9} {'ratio':>6} {'server CPU ms/embedding':>24}")
    for name, (_, _, batch) in CASES.items():
        print(
            f"HTTP {name:29} {rates[name]:12.0f} {reference[batch]:9.0f} {rates[name] / reference[batch]:6.2f}"
            f" {1000 * CPU_PER_EMBEDDING[name]:24.2f}"
        )
    print(f"pipeline batch 1 / 8 / 32: {reference[1]:.0f} / {reference[8]:.0f} / {reference[32]:.0f} embeddings/s")
    ms = sorted(1000 * value for value in health)
    print(
        f"/health beside 4 generation streams and 32 embedding clients: p50 {statistics.median(ms):.1f} ms,"
        f" p99 {percentile(ms, 99):.1f} ms, max {ms[-1]:.1f} ms ({len(ms)} probes)"
    )


if __name__ == "__main__":
    main()
