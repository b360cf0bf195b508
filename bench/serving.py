"""Serving benchmark: the raw engine and the server, same prompts, same process run.

    python bench/serving.py [--concurrency 1 4 16 32] [--tokens 64] [--rounds 3]

1. Raw engine: ContinuousBatchingPipeline.generate() on C chat prompts at once (no
   HTTP), 64 new tokens, ignore_eos, greedy -> output tok/s. Its TTFT is the first
   engine step of a lone request (the prefill).
2. Server: `ovtrio serve` as a subprocess, C concurrent streaming chat requests,
   each client sending `rounds` requests back to back, the same prompts and settings
   -> output tok/s (from usage), TTFT and inter-token latency p50/p99, and the ratio
   server/engine.
Also: idle RSS of the server, and time from process start to first streamed token.

The load generator speaks HTTP/1.1 over raw trio sockets and only scans for SSE
frames, so it takes as little CPU as possible away from the server on a small machine.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

TOPICS = [
    "a dragon",
    "the sea",
    "a lost key",
    "a robot",
    "the moon",
    "a small town",
    "a violin",
    "a storm",
    "a garden",
    "a train",
    "a lighthouse",
    "a fox",
    "a mountain",
    "a library",
    "a clock",
    "a river",
    "a desert",
    "a city at night",
    "a snowman",
    "a pirate",
    "a bakery",
    "a comet",
    "a forest",
    "a bridge",
    "a cat",
    "an island",
    "a castle",
    "a painter",
    "a volcano",
    "a market",
    "a whale",
    "a bicycle",
]


def prompts(count: int) -> list[str]:
    return [f"Write a short story about {TOPICS[i % len(TOPICS)]}." for i in range(count)]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


# ---- raw engine ---------------------------------------------------------------------


class RawEngine:
    """The engine alone, on the same prompts: the limit the server is measured against."""

    def __init__(self, model_path: str, tokens: int, pipeline: Any = None) -> None:
        """The embedded model's own pipeline, or `pipeline` (one the server built)."""
        import openvino_genai

        if pipeline is None:
            config = openvino_genai.SchedulerConfig()
            config.cache_size = 1
            config.enable_prefix_caching = True
            pipeline = openvino_genai.ContinuousBatchingPipeline(model_path, config, "CPU")
        self.pipe = pipeline
        self.tokenizer = self.pipe.get_tokenizer()
        self.gen = openvino_genai.GenerationConfig()
        self.gen.max_new_tokens = tokens
        self.gen.ignore_eos = True
        self.gen.do_sample = False
        self.tokens = tokens
        self.pipe.generate([self.chat_ids("Hello")], [self.gen])  # warm-up

    def chat_ids(self, text: str):
        prompt = self.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        return self.tokenizer.encode(prompt, add_special_tokens=False).input_ids

    def throughput(self, concurrency: int) -> float:
        """Output tok/s of generate() on `concurrency` prompts at once."""
        inputs = [self.chat_ids(p) for p in prompts(concurrency)]
        started = time.perf_counter()
        self.pipe.generate(inputs, [self.gen] * concurrency)
        return concurrency * self.tokens / (time.perf_counter() - started)

    def ttft_ms(self) -> float:
        """Median first step (the prefill) of a lone chat request."""
        first_steps = []
        for i, text in enumerate(prompts(10)):
            handle = self.pipe.add_request(10_000 + i, self.chat_ids(text), self.gen)
            started = time.perf_counter()
            self.pipe.step()
            first_steps.append(time.perf_counter() - started)
            handle.cancel()
            while self.pipe.has_non_finished_requests():
                self.pipe.step()
        return statistics.median(first_steps) * 1e3


# ---- server under load ---------------------------------------------------------------


@dataclass
class StreamResult:
    ttft: float
    inter_token: list[float] = field(default_factory=list)  # gaps between content chunks
    completion_tokens: int = 0
    generation_time: float = 0.0  # first content chunk to last

    @property
    def time_per_output_token(self) -> float:
        return self.generation_time / max(1, self.completion_tokens - 1)


def chat_request(model: str, text: str, tokens: int, **extra: Any) -> bytes:
    """A streamed greedy chat completion of `tokens` tokens (ignore_eos, usage in the last
    chunk) as raw HTTP/1.1 bytes, with `extra` fields in the body."""
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            **extra,
        }
    ).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


async def stream_chat(port: int, model: str, text: str, tokens: int) -> StreamResult:
    request = chat_request(model, text, tokens)
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        started = time.perf_counter()
        await stream.send_all(request)
        first: float | None = None
        last = 0.0
        gaps: list[float] = []
        tail = b""
        usage = 0
        while True:
            data = await stream.receive_some(65536)
            if not data:
                break
            now = time.perf_counter()
            chunk = tail + data
            # Count content-bearing SSE events in this read (the role chunk has none).
            events = chunk.count(b'"delta":{"content":"')
            if events:
                if first is None:
                    first = now
                else:
                    gaps.append(now - last)
                last = now
            if b'"usage":{' in chunk:
                at = chunk.rindex(b'"completion_tokens":') + len(b'"completion_tokens":')
                end = at
                while chunk[end : end + 1].isdigit():
                    end += 1
                usage = int(chunk[at:end])
            if b"data: [DONE]" in chunk:
                break
            tail = chunk[-64:]
    if first is None:
        raise RuntimeError("stream produced no tokens")
    return StreamResult(ttft=first - started, inter_token=gaps, completion_tokens=usage, generation_time=last - first)


async def load(port: int, model: str, concurrency: int, tokens: int, rounds: int) -> dict[str, float]:
    results: list[StreamResult] = []
    texts = prompts(concurrency)

    async def client(index: int) -> None:
        for _ in range(rounds):
            results.append(await stream_chat(port, model, texts[index], tokens))

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(concurrency):
            nursery.start_soon(client, i)
    elapsed = time.perf_counter() - started
    ttfts = [r.ttft * 1e3 for r in results]
    gaps = [g * 1e3 for r in results for g in r.inter_token]
    return {
        "tok_s": sum(r.completion_tokens for r in results) / elapsed,
        "ttft_p50": percentile(ttfts, 50),
        "ttft_p99": percentile(ttfts, 99),
        "itl_p50": percentile(gaps, 50),
        "itl_p99": percentile(gaps, 99),
        "tpot_p50": percentile([r.time_per_output_token * 1e3 for r in results], 50),
        "requests": len(results),
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def ready_by_http(port: int, alive: Callable[[], bool], timeout: float = 300) -> None:
    """Block until GET /health/ready answers 200 (a driver timing a start), or fail once
    `alive()` says the server is gone or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError("the server exited before it was ready")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/health/ready")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.02)
    raise RuntimeError("the server did not become ready")


async def wait_ready(port: int, process: subprocess.Popen, path: bytes = b"/health/ready") -> None:
    """Until GET `path` answers 200 (readiness is 503 while the model loads)."""
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
        except OSError:
            await trio.sleep(0.05)
            continue
        async with stream:
            await stream.send_all(b"GET " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            reply = b""
            while b"\r\n" not in reply and (data := await stream.receive_some(4096)):
                reply += data
        if reply.startswith(b"HTTP/1.1 200"):
            return
        await trio.sleep(0.05)


async def http_get(port: int, path: bytes) -> bytes:
    """The body of GET `path`, read until the server closes the connection."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(b"GET " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        reply = b""
        while data := await stream.receive_some(65536):
            reply += data
    return reply.split(b"\r\n\r\n", 1)[1]


async def served_model_id(port: int) -> str:
    """The id of the first model the server lists."""
    return json.loads(await http_get(port, b"/v1/models"))["data"][0]["id"]


async def server_figures(
    args: argparse.Namespace, model_path: Path, engine: RawEngine
) -> tuple[dict[int, dict[str, float]], dict[str, float]]:
    port = free_port()
    launched = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "ovtrio", "serve", "--model", str(model_path), "--port", str(port),
         "--log-level", "warning", *args.server_arg],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        await wait_ready(port, process)
        model = await served_model_id(port)
        sent = time.perf_counter()
        first = await stream_chat(port, model, "Hello!", 4)
        start_to_first_token = sent + first.ttft - launched
        await trio.sleep(2)
        misc = {"start_to_first_token_s": start_to_first_token, "idle_rss_mb": rss_mb(process.pid)}
        figures = {}
        for concurrency in args.concurrency:
            await load(port, model, concurrency, args.tokens, 1)  # warm the shapes
            # This machine's speed drifts by +-15% from one second to the next, so the
            # engine and the server take turns, and the figures are medians of the turns.
            turns = []
            for _ in range(args.turns):
                engine_tok_s = engine.throughput(concurrency)
                step_seconds = await metric(port, "ovtrio_engine_step_seconds_total")
                started = time.perf_counter()
                turn = await load(port, model, concurrency, args.tokens, args.rounds)
                busy = await metric(port, "ovtrio_engine_step_seconds_total") - step_seconds
                turn["engine_busy"] = busy / (time.perf_counter() - started)
                turn["engine_tok_s"] = engine_tok_s
                turn["ratio"] = turn["tok_s"] / engine_tok_s
                turns.append(turn)
            figures[concurrency] = {key: statistics.median(t[key] for t in turns) for key in turns[0]}
        misc["engine_ttft_ms"] = engine.ttft_ms()
        idle_cpu_start = cpu_seconds(process.pid)
        await trio.sleep(3)
        misc["idle_cpu_percent"] = (cpu_seconds(process.pid) - idle_cpu_start) / 3 * 100
        return figures, misc
    finally:
        process.terminate()
        process.wait(timeout=30)


async def metric(port: int, name: str) -> float:
    reply = await http_get(port, b"/metrics")
    # One model: its series, labelled model_name="..." (or none, for the HTTP ones).
    for line in reply.decode().splitlines():
        if line.startswith((name + " ", name + "{")):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="embedded", help="a GGUF file ('embedded': the embedded model)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="requests each client sends per turn")
    parser.add_argument("--turns", type=int, default=5, help="engine/server turns per concurrency")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="extra `ovtrio serve` flag (repeat), e.g. --server-arg=--no-gil-free-step",
    )
    args = parser.parse_args()
    if 1 not in args.concurrency:
        args.concurrency = [1, *args.concurrency]

    from hardware import gguf_path

    model_path = gguf_path(args.model)
    engine = RawEngine(str(model_path), args.tokens)
    server, misc = trio.run(server_figures, args, model_path, engine)

    print(
        f"ovtrio serving benchmark: {model_path.name}, CPU, {os.cpu_count()} cores,"
        f" {args.tokens} output tokens, ignore_eos, greedy, chat streaming"
    )
    header = (
        f"{'conc':>4} {'engine tok/s':>12} {'server tok/s':>12} {'ratio':>6} {'TTFT p50':>9} {'TTFT p99':>9}"
        f" {'ITL p50':>8} {'ITL p99':>8} {'TPOT':>7} {'in step':>7}"
    )
    print(header)
    for c in args.concurrency:
        s = server[c]
        print(
            f"{c:>4} {s['engine_tok_s']:>12.1f} {s['tok_s']:>12.1f} {s['ratio']:>6.2f}"
            f" {s['ttft_p50']:>7.1f}ms {s['ttft_p99']:>7.1f}ms {s['itl_p50']:>6.1f}ms {s['itl_p99']:>6.1f}ms"
            f" {s['tpot_p50']:>5.1f}ms {s['engine_busy']:>6.0%}"
        )
    print(
        "(ITL: gap between streamed chunks; TPOT: time per output token after the first;"
        " in step: share of the server's wall time spent inside the engine's step())"
    )
    if args.server_arg:
        print(f"server flags: {' '.join(args.server_arg)}")
    print(f"engine TTFT (prefill step of a lone request): {misc['engine_ttft_ms']:.1f} ms")
    print(
        f"server idle RSS: {misc['idle_rss_mb']:.0f} MB; idle CPU: {misc['idle_cpu_percent']:.1f}%;"
        f" process start to first token: {misc['start_to_first_token_s']:.2f} s"
    )
    if args.json:
        args.json.write_text(json.dumps({"server": server, "misc": misc}, indent=2))


if __name__ == "__main__":
    main()
