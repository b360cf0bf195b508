"""Responsiveness: does the server answer while long prompts prefill?

    python -m bench responsiveness [--model PATH.gguf] [--prefills 4] [--modes engine binding no-slices gil-free]

One scenario, up to four times in one run: the raw engine (no HTTP, the limit), the
server stepping the engine through the binding's `step()` (`--no-gil-free-step`: the GIL
is held for each step, the loop pauses), the server with the GIL-free step but long
prompts prefilled whole (`no-slices`: `--long-prefill-token-threshold 0`), and the server
as it runs by default (`gil-free`: GIL-free steps, long prompts prefilled in slices).

- 8 streams decode (streaming chat, ignore_eos, greedy; each restarts when it ends);
- once all 8 stream, 2,000-token prompts are prefilled one after the other (completions,
  one token out; each starts with a different token, so nothing comes from the prefix
  cache): the measured window is these `--prefills` prompts;
- meanwhile /health is probed every 50 ms (each probe on its own connection, fired on
  time whether or not the last one was answered, as a liveness probe does), and a short
  streaming chat request starts every second.

Reported: /health latency p50/p99/max; the short requests' time to first token p50/p99;
the 8 streams' tokens per second and the long prompts' time to complete, against the raw
engine running the same mix. The raw engine also gives the bound for the short requests'
TTFT: one step that prefills a chunk plus one decode step (medians).

Run it on the embedded model and on the 1B-class fixture:

    python -m bench.make_tiny_llama /tmp/tiny-llama-1.1b.gguf
    python -m bench responsiveness --model /tmp/tiny-llama-1.1b.gguf --prefills 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import trio

from bench.driver import server as servers
from bench.driver.requests import TOPICS
from bench.driver.results import Outcome
from bench.driver.server import http_request, metric, wait_ready
from bench.driver.stats import percentile

STREAMS = 8
LONG_PROMPT_TOKENS = 2000
PROBE_INTERVAL = 0.05
SHORT_INTERVAL = 1.0
SHORT_TOKENS = 4
SERVED_NAME = "bench"
# Token ids the long prompts are made of: ordinary vocabulary entries on both models.
LONG_TOKEN_BASE = 1000


def long_prompt(index: int) -> list[int]:
    first = LONG_TOKEN_BASE + 7 * index  # a new first token: no prefix-cache hit
    return [first] + [LONG_TOKEN_BASE + (i * 37) % 20000 for i in range(1, LONG_PROMPT_TOKENS)]


def decoder_text(index: int) -> str:
    return f"Write a long story about {TOPICS[index % len(TOPICS)]}."


def short_text(index: int) -> str:
    return f"Name one thing about {TOPICS[(index + 11) % len(TOPICS)]}."


@dataclass
class Figures:
    health_ms: list[float] = field(default_factory=list)
    short_ttft_ms: list[float] = field(default_factory=list)
    long_prompt_s: list[float] = field(default_factory=list)
    stream_tokens: int = 0
    seconds: float = 0.0
    decode_step_ms: list[float] = field(default_factory=list)
    prefill_step_ms: list[float] = field(default_factory=list)

    @property
    def stream_tok_s(self) -> float:
        return self.stream_tokens / self.seconds if self.seconds else float("nan")


# ---- raw engine ------------------------------------------------------------------------


def raw_engine(model: str, prefills: int, decode_tokens: int, batched_tokens: int) -> Figures:
    """The same mix on the engine alone: requests added between steps on the same schedule."""
    import numpy as np
    import openvino as ov
    import openvino_genai

    config = openvino_genai.SchedulerConfig()
    config.cache_size = 1
    config.max_num_batched_tokens = batched_tokens
    config.enable_prefix_caching = True
    config.dynamic_split_fuse = True
    pipe = openvino_genai.ContinuousBatchingPipeline(model, config, "CPU")
    tokenizer = pipe.get_tokenizer()

    def chat_ids(text: str) -> list[int]:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        return tokenizer.encode(prompt, add_special_tokens=False).input_ids.data[0].tolist()

    def generation(tokens: int) -> openvino_genai.GenerationConfig:
        gen = openvino_genai.GenerationConfig()
        gen.max_new_tokens = tokens
        gen.ignore_eos = True
        gen.do_sample = False
        return gen

    ids = iter(range(1, 1 << 30))

    @dataclass
    class Live:
        kind: str
        handle: object
        added: float
        first: bool = False

    live: dict[int, Live] = {}

    def add(kind: str, prompt: list[int], tokens: int) -> None:
        request_id = next(ids)
        handle = pipe.add_request(request_id, ov.Tensor(np.asarray([prompt], dtype=np.int64)), generation(tokens))
        live[request_id] = Live(kind, handle, time.perf_counter())

    figures = Figures()
    counting = False

    def step() -> None:
        prefilling = any(not request.first for request in live.values())
        started = time.perf_counter()
        pipe.step()
        step_ms = (time.perf_counter() - started) * 1e3
        if counting:
            (figures.prefill_step_ms if prefilling else figures.decode_step_ms).append(step_ms)
        for request_id, request in list(live.items()):
            while request.handle.can_read():
                for output in request.handle.read().values():
                    if counting and request.kind == "short" and not request.first:
                        figures.short_ttft_ms.append((time.perf_counter() - request.added) * 1e3)
                    request.first = True
                    if counting and request.kind == "decode":
                        figures.stream_tokens += len(output.generated_ids)
            if request.handle.get_status() != openvino_genai.GenerationStatus.RUNNING:
                del live[request_id]
                if request.kind == "decode":
                    add("decode", chat_ids(decoder_text(request_id)), decode_tokens)
                elif request.kind == "long":
                    figures.long_prompt_s.append(time.perf_counter() - request.added)

    warm_up = ov.Tensor(np.asarray([chat_ids("Hello!")], dtype=np.int64))
    pipe.generate([warm_up], [generation(2)])  # the first request compiles kernels
    for i in range(STREAMS):
        add("decode", chat_ids(decoder_text(i)), decode_tokens)
    while any(not request.first for request in live.values()):
        step()
    counting = True
    for _ in range(20):  # decode-only steps, for the TTFT bound
        step()
    figures.stream_tokens = 0
    started = time.perf_counter()
    next_short = started
    for index in range(prefills):
        add("long", long_prompt(index), 1)
        while any(request.kind == "long" for request in live.values()):
            if time.perf_counter() >= next_short:
                add("short", chat_ids(short_text(len(figures.long_prompt_s))), SHORT_TOKENS)
                next_short += SHORT_INTERVAL
            step()
    figures.seconds = time.perf_counter() - started
    for request in live.values():
        request.handle.cancel()
    while pipe.has_non_finished_requests():
        pipe.step()
    return figures


# ---- server ------------------------------------------------------------------------------


def post(path: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Connection: close\r\nContent-Length: {len(data)}\r\n\r\n"
    ).encode() + data


async def first_token_after(port: int, body: dict) -> float:
    """Send a streaming chat request; seconds until its first content chunk, then drain."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        started = time.perf_counter()
        await stream.send_all(post("/v1/chat/completions", body))
        first = None
        while data := await stream.receive_some(65536):
            if first is None and b'"delta":{"content":"' in data:
                first = time.perf_counter() - started
            if b"data: [DONE]" in data:
                break
    if first is None:
        raise RuntimeError("stream produced no tokens")
    return first


def chat_body(text: str, tokens: int) -> dict:
    return {
        "model": SERVED_NAME,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }


async def scenario(port: int, prefills: int, decode_tokens: int) -> Figures:
    figures = Figures()
    decoding = trio.Event()
    first_tokens = 0
    stream_tokens = 0
    counting = False

    async def decoder(index: int) -> None:
        nonlocal first_tokens, stream_tokens
        n = index
        while True:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(post("/v1/chat/completions", chat_body(decoder_text(n), decode_tokens)))
                counted = False
                while data := await stream.receive_some(65536):
                    # One token per chunk: fewer than 12 streams get a chunk every step.
                    chunks = data.count(b'"delta":{"content":"')
                    if counting:
                        stream_tokens += chunks
                    if not counted and chunks:
                        counted = True
                        first_tokens += 1
                        if first_tokens == STREAMS:
                            decoding.set()
                    if b"data: [DONE]" in data:
                        break
            n += STREAMS

    async def probe() -> None:
        started = time.perf_counter()
        reply = await http_request(port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        if reply.startswith(b"HTTP/1.1 200"):
            figures.health_ms.append((time.perf_counter() - started) * 1e3)

    async def short(index: int) -> None:
        ttft = await first_token_after(port, chat_body(short_text(index), SHORT_TOKENS))
        figures.short_ttft_ms.append(ttft * 1e3)

    async def probes(stop: trio.Event) -> None:
        async with trio.open_nursery() as nursery:
            started = time.perf_counter()
            next_probe, next_short, shorts = started, started, 0
            while not stop.is_set():
                now = time.perf_counter()
                if now >= next_short:
                    nursery.start_soon(short, shorts)
                    shorts += 1
                    next_short += SHORT_INTERVAL
                if now >= next_probe:
                    nursery.start_soon(probe)
                    next_probe += PROBE_INTERVAL
                with trio.move_on_after(max(0.0, min(next_probe, next_short) - time.perf_counter())):
                    await stop.wait()

    async with trio.open_nursery() as background:
        for i in range(STREAMS):
            background.start_soon(decoder, i)
        await decoding.wait()
        stop = trio.Event()
        async with trio.open_nursery() as window:
            window.start_soon(probes, stop)
            counting = True
            started = time.perf_counter()
            for index in range(prefills):
                sent = time.perf_counter()
                body = {"model": SERVED_NAME, "prompt": long_prompt(index), "max_tokens": 1}
                reply = await http_request(port, post("/v1/completions", body))
                if not reply.startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(reply[:300].decode(errors="replace"))
                figures.long_prompt_s.append(time.perf_counter() - sent)
            figures.seconds = time.perf_counter() - started
            figures.stream_tokens = stream_tokens
            stop.set()
        background.cancel_scope.cancel()
    return figures


async def server_run(
    model: str, mode: str, prefills: int, decode_tokens: int, batched_tokens: int, extra: list[str]
) -> Figures:
    flags = {"binding": ["--no-gil-free-step"], "no-slices": ["--long-prefill-token-threshold", "0"]}.get(mode, [])
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"ovtrio-responsiveness-{mode}.log", "w")
    # The mode's own flags win.
    server = servers.start(
        ["--model", model, "--served-model-name", SERVED_NAME, "--max-num-batched-tokens", str(batched_tokens),
         "--log-level", "info", *extra, *flags],
        log=log,
    )  # fmt: skip
    port, process = server.port, server.process
    try:
        with trio.fail_after(300):
            await wait_ready(port, process)
        expected = 0 if mode == "binding" else 1
        if await metric(port, "ovtrio_engine_step_releases_gil") != expected:
            raise RuntimeError(f"the server did not step the engine as '{mode}' asks")
        await first_token_after(port, chat_body("Hello!", 2))  # first request compiles kernels
        return await scenario(port, prefills, decode_tokens)
    finally:
        servers.stop(process)
        log.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="GGUF file or OpenVINO IR folder (default: the embedded model)")
    parser.add_argument("--prefills", type=int, default=4, help="2,000-token prompts in the measured window")
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["engine", "binding", "no-slices", "gil-free"],
        choices=["engine", "binding", "no-slices", "gil-free"],
    )
    parser.add_argument("--decode-tokens", type=int, default=1024, help="max_tokens of each decoding stream")
    parser.add_argument("--max-num-batched-tokens", type=int, default=256, help="the server's and engine's setting")
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="extra `ovtrio serve` flag (repeat), e.g. --server-arg=--long-prefill-token-threshold=128",
    )


def run(args: argparse.Namespace) -> Outcome:
    from ovtrio.model import embedded_model_path

    model = args.model or str(embedded_model_path())
    results: dict[str, Figures] = {}
    for mode in args.modes:
        if mode == "engine":
            results[mode] = raw_engine(model, args.prefills, args.decode_tokens, args.max_num_batched_tokens)
        else:
            results[mode] = trio.run(
                server_run,
                model,
                mode,
                args.prefills,
                args.decode_tokens,
                args.max_num_batched_tokens,
                args.server_arg,
            )
        print(f"  {mode}: done", file=sys.stderr)

    load = os.getloadavg()
    print(
        f"ovtrio responsiveness: {Path(model).name}, CPU, {os.cpu_count()} cores; {STREAMS} decoding streams,"
        f" {args.prefills} prompts of {LONG_PROMPT_TOKENS} tokens prefilled one after the other"
        f" (--max-num-batched-tokens {args.max_num_batched_tokens}), /health every {PROBE_INTERVAL * 1e3:.0f} ms,"
        f" a short chat every {SHORT_INTERVAL:.0f} s; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    if args.server_arg:
        print(f"server flags: {' '.join(args.server_arg)}")
    print(
        f"{'stepping':>9} {'health p50':>10} {'p99':>9} {'max':>9} {'probes':>6}"
        f" {'short TTFT p50':>14} {'p99':>9} {'n':>3} {'stream tok/s':>12} {'long prompt':>11}"
    )
    for mode, f in results.items():
        health = (
            f"{percentile(f.health_ms, 50):>8.1f}ms {percentile(f.health_ms, 99):>7.1f}ms"
            f" {max(f.health_ms):>7.1f}ms {len(f.health_ms):>6}"
            if f.health_ms
            else f"{'-':>10} {'-':>9} {'-':>9} {'-':>6}"
        )
        print(
            f"{mode:>9} {health} {percentile(f.short_ttft_ms, 50):>12.1f}ms {percentile(f.short_ttft_ms, 99):>7.1f}ms"
            f" {len(f.short_ttft_ms):>3} {f.stream_tok_s:>12.1f} {statistics.median(f.long_prompt_s):>10.2f}s"
        )
    engine = results.get("engine")
    if engine:
        chunk = statistics.median(engine.prefill_step_ms) if engine.prefill_step_ms else float("nan")
        decode = statistics.median(engine.decode_step_ms) if engine.decode_step_ms else float("nan")
        bound = chunk + decode
        print(
            f"engine: step with a prefill chunk {chunk:.1f} ms, decode step {decode:.1f} ms (medians):"
            f" short TTFT bound {bound:.1f} ms"
        )
        for mode, f in results.items():
            if mode != "engine":
                print(
                    f"{mode}: short TTFT p99 {percentile(f.short_ttft_ms, 99) / bound:.2f} of the bound,"
                    f" stream tok/s {f.stream_tok_s / engine.stream_tok_s:.2f} of the engine's,"
                    f" long prompt {statistics.median(f.long_prompt_s) / statistics.median(engine.long_prompt_s):.2f}"
                    " of the engine's time"
                )
    print(
        "(stream tok/s: tokens the 8 streams received per second in the window; long prompt: median time from"
        " sending a 2,000-token prompt to its one token)"
    )
    summary: dict[str, float] = {}
    for mode, f in results.items():
        if f.health_ms:
            summary[f"{mode}: /health p99 ms"] = percentile(f.health_ms, 99)
            summary[f"{mode}: /health max ms"] = max(f.health_ms)
        summary[f"{mode}: short TTFT p99 ms"] = percentile(f.short_ttft_ms, 99)
        summary[f"{mode}: stream tok/s"] = f.stream_tok_s
        summary[f"{mode}: long prompt s"] = statistics.median(f.long_prompt_s)
    return Outcome(summary, {mode: vars(f) for mode, f in results.items()}, Path(args.model).name if args.model else "")
