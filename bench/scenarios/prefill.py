"""Long prompts' first token, ovtrio against llama-server: the same GGUF, fresh prompts, interleaved.

    python -m bench.build_llama_server     # once: builds the peer (5-10 min on 2 cores)
    python -m bench.make_tiny_llama /tmp/tiny-llama-q4_0.gguf   # the 1B-class fixture
    python -m bench prefill [--model embedded /tmp/tiny-llama-q4_0.gguf] [--sizes 512 2048 4096 8192]
                            [--turns 3] [--streams 4] [--multi-turn 10]

Both servers run each GGUF given (default: the embedded SmolLM2-135M-Instruct Q4_1) on
the CPU: `ovtrio serve --model <gguf>` with its defaults, `llama-server -np 6 -c
<6 x the model's context> -t <cores>` (six slots, each of the model's whole context).
Every prompt is fresh: a chat message of random words, different for every request, so
neither server's prefix cache holds any of it past the chat template's head. Sizes are
prompt tokens as ovtrio's usage counts them, capped at the model's context less the
reply.

1. Alone: one streamed chat completion of 2 tokens per size, nothing else running:
   its first token (TTFT) and prefill tokens/s (prompt tokens over TTFT).
2. Beside decoding streams: `--streams` clients stream 256-token completions back to
   back while the same request is sent; its TTFT, and the decoding streams'
   inter-token gaps while it prefilled (those that ended between its send and its
   first token), p50 and p99.
3. Multi-turn (`--multi-turn` turns, the embedded model only, both prefix caches on): a
   conversation whose every turn adds a user message of about 300 tokens of random
   words, re-sends the whole history with each server's own earlier replies, and asks
   for 32 tokens; the first token of each turn.

In each of `--turns` turns, every part (a size alone, a size beside the streams, the
conversation) runs on both servers back to back, in alternating order; each figure is
the median of the turns, the TTFT p90 over them too.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from bench.build_llama_server import binary_path
from bench.driver import server
from bench.driver.hardware import describe_cpu, gguf_path
from bench.driver.requests import prompts
from bench.driver.results import Outcome
from bench.driver.server import free_port, http_request, served_model_id, wait_ready
from bench.driver.stats import percentile
from bench.driver.turns import order

SLOTS = 6
# Words the random prompts are drawn from: common English, a token or two each.
WORDS = (
    "time person year way day thing man world life hand part child eye woman place work week case point"
    " government company number group problem fact river stone garden window light music letter paper"
    " table market story money water night paper morning answer reason power city friend mother father"
    " house school table animal summer winter spring autumn forest mountain ocean island bridge street"
    " small large early late young old green blue red quiet loud happy careful simple strange bright"
    " run walk read write speak listen carry build open close begin finish choose follow remember travel"
).split()


def context_length(gguf: Path) -> int:
    import gguf as gguf_module

    reader = gguf_module.GGUFReader(gguf)
    architecture = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    field_ = reader.fields[f"{architecture}.context_length"]
    return int(field_.parts[field_.data[0]][0])


def start_llama_server(binary: Path, gguf: Path, port: int, context: int) -> subprocess.Popen:
    return subprocess.Popen(
        [
            str(binary),
            "-m",
            str(gguf),
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "-np",
            str(SLOTS),
            "-c",
            str(SLOTS * context),
            "-t",
            str(os.cpu_count() or 2),
            "--log-disable",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def chat_body(model: str, messages: list[dict[str, str]], tokens: int, stream: bool = True) -> bytes:
    body = json.dumps(
        {
            "model": model,
            "messages": messages,
            "max_tokens": tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": stream,
            **({"stream_options": {"include_usage": True}} if stream else {}),
        }
    ).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


@dataclass
class Streamed:
    sent: float
    first: float
    text: str = ""
    prompt_tokens: int = 0
    gaps: list[tuple[float, float]] = field(default_factory=list)  # (when, gap) between content chunks

    @property
    def ttft(self) -> float:
        return self.first - self.sent


async def stream(
    port: int, model: str, messages: list[dict[str, str]], tokens: int, sink: list[tuple[float, float]] | None = None
) -> Streamed:
    """One streamed chat completion: when it was sent, its first content chunk, the
    gaps between content chunks (also appended to `sink` as they come), its text and
    usage's prompt tokens."""
    stream_ = await trio.open_tcp_stream("127.0.0.1", port)
    buffer = b""
    async with stream_:
        sent = time.perf_counter()
        await stream_.send_all(chat_body(model, messages, tokens))
        first: float | None = None
        last = 0.0
        gaps: list[tuple[float, float]] = [] if sink is None else sink
        while data := await stream_.receive_some(65536):
            now = time.perf_counter()
            if b'"delta":{"content":"' in data:
                if first is None:
                    first = now
                else:
                    gaps.append((now, now - last))
                last = now
            buffer += data
            if b"data: [DONE]" in data:
                break
    if first is None:
        raise RuntimeError(f"stream produced no tokens: {buffer[-300:]!r}")
    text, prompt_tokens = "", 0
    for line in buffer.split(b"\n"):
        if not line.startswith(b"data: {"):
            continue
        event = json.loads(line[6:])
        for choice in event.get("choices") or []:
            text += (choice.get("delta") or {}).get("content") or ""
        if event.get("usage"):
            prompt_tokens = event["usage"]["prompt_tokens"]
    return Streamed(sent, first, text, prompt_tokens, [] if sink is not None else gaps)


async def prompt_tokens(port: int, model: str, text: str) -> int:
    """Prompt tokens ovtrio counts for one user message of `text`."""
    reply = await http_request(port, chat_body(model, [{"role": "user", "content": text}], 1, stream=False))
    return int(json.loads(reply.partition(b"\r\n\r\n")[2])["usage"]["prompt_tokens"])


class Prompts:
    """Fresh prompts of a given number of tokens: random words, a new draw each call."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.per_word = 1.0
        self.head = 0

    def words(self, count: int) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(count))

    async def calibrate(self, port: int, model: str) -> None:
        self.head = await prompt_tokens(port, model, "x")
        counted = await prompt_tokens(port, model, self.words(2000))
        self.per_word = (counted - self.head) / 2000

    def text(self, tokens: int) -> str:
        # A number first, so that no two prompts share even their first block.
        return f"{self.rng.randrange(10**9)} " + self.words(max(1, round((tokens - self.head - 4) / self.per_word)))


class Decoders:
    """`count` clients streaming 256-token completions back to back until stopped; the
    gaps between their content chunks, with when each ended."""

    def __init__(self, port: int, model: str, count: int) -> None:
        self.port, self.model, self.count = port, model, count
        self.gaps: list[tuple[float, float]] = []
        self.started = 0

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        texts = prompts(self.count)
        decoding = trio.Event()

        async def client(index: int) -> None:
            while True:
                await stream(self.port, self.model, [{"role": "user", "content": texts[index]}], 256, self.gaps)

        async def watch() -> None:
            # Ready once every client has streamed a few chunks.
            while len(self.gaps) < 4 * self.count:
                await trio.sleep(0.01)
            decoding.set()

        async with trio.open_nursery() as nursery:
            for i in range(self.count):
                nursery.start_soon(client, i)
            nursery.start_soon(watch)
            await decoding.wait()
            task_status.started()

    def between(self, start: float, end: float) -> list[float]:
        return [gap for when, gap in self.gaps if start <= when <= end]


async def one_request(port: int, model: str, text: str) -> Streamed:
    return await stream(port, model, [{"role": "user", "content": text}], 2)


@dataclass
class Measured:
    ttft: dict[str, list[float]] = field(default_factory=dict)  # by part ("alone, 4096"), ms
    tokens: dict[str, list[int]] = field(default_factory=dict)  # prompt tokens of each
    gaps: dict[str, list[float]] = field(default_factory=dict)  # decoders' gaps during it, ms
    turns: dict[int, list[float]] = field(default_factory=dict)  # multi-turn: TTFT ms by turn


async def alone(port: int, model: str, texts: dict[int, str], into: Measured) -> None:
    for size, text in texts.items():
        reply = await one_request(port, model, text)
        into.ttft.setdefault(f"alone, {size}", []).append(reply.ttft * 1e3)
        into.tokens.setdefault(f"alone, {size}", []).append(reply.prompt_tokens)


async def beside(port: int, model: str, texts: dict[int, str], streams: int, into: Measured) -> None:
    decoders = Decoders(port, model, streams)
    async with trio.open_nursery() as nursery:
        await nursery.start(decoders.run)
        for size, text in texts.items():
            await trio.sleep(0.5)  # the decoders alone a while
            reply = await one_request(port, model, text)
            part = f"beside {streams}, {size}"
            into.ttft.setdefault(part, []).append(reply.ttft * 1e3)
            into.tokens.setdefault(part, []).append(reply.prompt_tokens)
            into.gaps.setdefault(part, []).extend(g * 1e3 for g in decoders.between(reply.sent, reply.first))
        nursery.cancel_scope.cancel()


async def conversation(port: int, model: str, users: list[str], into: Measured) -> None:
    messages: list[dict[str, str]] = []
    for turn, text in enumerate(users, 1):
        messages.append({"role": "user", "content": text})
        reply = await stream(port, model, messages, 32)
        messages.append({"role": "assistant", "content": reply.text})
        into.turns.setdefault(turn, []).append(reply.ttft * 1e3)


async def measure(args: argparse.Namespace, gguf: Path, multi_turn: int) -> dict[str, Measured]:
    processes: dict[str, subprocess.Popen] = {}
    servers: dict[str, tuple[int, str]] = {}
    context = context_length(gguf)
    try:
        port = free_port()
        processes["ovtrio"] = server.start(["--model", str(gguf), "--log-level", "warning"], port=port).process
        await wait_ready(port, processes["ovtrio"])
        model = await served_model_id(port)
        servers["ovtrio"] = (port, model)
        binary = binary_path()
        if binary.exists():
            port = free_port()
            processes["llama-server"] = start_llama_server(binary, gguf, port, context)
            await wait_ready(port, processes["llama-server"], b"/health")
            servers["llama-server"] = (port, model)
        else:
            print(f"llama-server not built ({binary} missing; run python -m bench.build_llama_server): ovtrio alone")
        fresh = Prompts(seed=len(gguf.name))
        await fresh.calibrate(*servers["ovtrio"])
        sizes = sorted({min(size, context - 64) for size in args.sizes})
        print(f"{gguf.name}: context {context}; prompt sizes {sizes}; {fresh.per_word:.2f} tokens a word")
        measured = {name: Measured() for name in servers}
        for port, model in servers.values():  # warm the shapes
            await one_request(port, model, fresh.text(sizes[0]))
            await beside(port, model, {sizes[0]: fresh.text(sizes[0])}, args.streams, Measured())
        # Each part runs on both servers back to back, in alternating order: the
        # machine's speed drifts less between the two than over a whole turn.
        for turn in range(args.turns):
            started = time.perf_counter()
            for size in sizes:
                for name in order(list(servers), turn, alternate=True):
                    await alone(*servers[name], {size: fresh.text(size)}, measured[name])
                for name in order(list(servers), turn + 1, alternate=True):
                    await beside(*servers[name], {size: fresh.text(size)}, args.streams, measured[name])
                print(f"  turn {turn + 1}, {size} tokens: {time.perf_counter() - started:.0f} s", flush=True)
            if multi_turn:
                for name in order(list(servers), turn, alternate=True):
                    users = [fresh.text(300) for _ in range(multi_turn)]
                    await conversation(*servers[name], users, measured[name])
                print(f"  turn {turn + 1}, multi-turn: {time.perf_counter() - started:.0f} s", flush=True)
        return measured
    finally:
        for process in processes.values():
            server.stop(process, 30)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", nargs="+", default=["embedded"], help="GGUF files to serve ('embedded': the embedded model)"
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 2048, 4096, 8192], help="prompt tokens")
    parser.add_argument("--streams", type=int, default=4, help="decoding streams beside the long prompt")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument(
        "--multi-turn", type=int, default=10, help="turns of the conversation (embedded model only; 0: none)"
    )


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def run(args: argparse.Namespace) -> Outcome:
    started = time.perf_counter()
    machine = describe_cpu()
    print(f"cpu: {machine}")
    summary: dict[str, Any] = {}
    samples: dict[str, Any] = {}
    for name in args.model:
        gguf = gguf_path(name)
        multi_turn = args.multi_turn if name == "embedded" else 0
        measured = trio.run(measure, args, gguf, multi_turn)
        ours, peer = measured["ovtrio"], measured.get("llama-server")
        label = gguf.name
        print(f"\n{label}: medians of {args.turns} interleaved turns (ms)")
        print(f"{'part':<16} {'tokens':>6} {'ovtrio':>8} {'p90':>8} {'tok/s':>7} {'llama':>8} {'tok/s':>7} {'ratio':>6}"
              f" {'ITL p50/p99 ovtrio':>19} {'llama':>13}")  # fmt: skip
        for part in ours.ttft:
            tokens = int(median(ours.tokens[part]))
            o = median(ours.ttft[part])
            summary[f"{label}: prompt tokens, {part}"] = tokens
            summary[f"{label}: ovtrio TTFT p50 ms, {part}"] = o
            summary[f"{label}: ovtrio TTFT p90 ms, {part}"] = percentile(ours.ttft[part], 90)
            summary[f"{label}: ovtrio prefill tok/s, {part}"] = tokens / o * 1e3
            line = f"{part:<16} {tokens:>6} {o:>8.0f} {percentile(ours.ttft[part], 90):>8.0f} {tokens / o * 1e3:>7.0f}"
            itl = ""
            if part in ours.gaps:
                summary[f"{label}: ovtrio ITL p50 ms, {part}"] = percentile(ours.gaps[part], 50)
                summary[f"{label}: ovtrio ITL p99 ms, {part}"] = percentile(ours.gaps[part], 99)
                itl = f"{percentile(ours.gaps[part], 50):>8.0f}/{percentile(ours.gaps[part], 99):<6.0f}"
            if peer is not None:
                p = median(peer.ttft[part])
                summary[f"{label}: llama-server TTFT p50 ms, {part}"] = p
                summary[f"{label}: llama-server TTFT p90 ms, {part}"] = percentile(peer.ttft[part], 90)
                summary[f"{label}: llama-server prefill tok/s, {part}"] = tokens / p * 1e3
                summary[f"{label}: ovtrio/llama-server TTFT, {part}"] = o / p
                line += f" {p:>8.0f} {tokens / p * 1e3:>7.0f} {o / p:>6.2f}"
                if part in peer.gaps:
                    summary[f"{label}: llama-server ITL p50 ms, {part}"] = percentile(peer.gaps[part], 50)
                    summary[f"{label}: llama-server ITL p99 ms, {part}"] = percentile(peer.gaps[part], 99)
                    itl += f" {percentile(peer.gaps[part], 50):>6.0f}/{percentile(peer.gaps[part], 99):<6.0f}"
            print(line + " " + itl)
        for turn in ours.turns:
            o = median(ours.turns[turn])
            summary[f"{label}: multi-turn ovtrio TTFT p50 ms, turn {turn}"] = o
            if peer is not None:
                p = median(peer.turns[turn])
                summary[f"{label}: multi-turn llama-server TTFT p50 ms, turn {turn}"] = p
                summary[f"{label}: multi-turn ovtrio/llama-server, turn {turn}"] = o / p
            print(f"multi-turn {turn:>2}: ovtrio {o:>6.0f} ms" + (f", llama-server {p:>6.0f} ms" if peer else ""))
        samples[label] = {name: vars(m) for name, m in measured.items()}
    print(f"(ratio: ovtrio TTFT / llama-server's; {time.perf_counter() - started:.0f} s)")
    variant = "" if args.model == ["embedded"] else "models: " + " ".join(Path(m).name for m in args.model)
    return Outcome(summary, {"machine": machine, "measured": samples}, variant)
