"""The load most scenarios put on a server: C clients streaming greedy chat completions
(ignore_eos, so every request generates the same number of tokens) back to back.

The load generator speaks HTTP/1.1 over raw trio sockets and only scans for SSE
frames, so it takes as little CPU as possible away from the server on a small machine.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import trio

from bench.driver.stats import percentile

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
    """`concurrency` clients, each sending `rounds` requests back to back: output tok/s
    (from usage), TTFT, inter-token gap and time per output token percentiles (ms)."""
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
