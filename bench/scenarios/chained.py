"""Chained conversations: does a turn's first token slow down as the conversation grows?

And what does a WebSocket save over HTTP per turn?

    python -m bench chained [--turns 10] [--tokens 32]

Runs a conversation of N turns against `ovtrio serve`, each turn a streamed Responses
request continuing the previous one with previous_response_id, and prints the time to
first token of every turn. With the engine's prefix cache, turn N re-reads the earlier
turns from the cache, so its TTFT should stay near turn 1's although its prompt is
many times longer. For the engine-side limit, the same run measures the raw engine's
prefill of the last turn's prompt with and without that prefix in its cache.

The same conversation then runs over one WebSocket (Responses WebSocket mode, the
chain kept with store=false on the connection), and both transports' per-turn latency
(first token, and the whole turn) are printed side by side.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import httpx

from bench.driver.results import Outcome
from bench.driver.server import serving

MODEL = "SmolLM2-135M-Instruct"
QUESTIONS = [
    "Tell me about the sea.",
    "Why is it salty?",
    "What lives in it?",
    "How deep is it?",
    "Who explored it first?",
    "What is a reef?",
    "Are reefs in danger?",
    "What can we do?",
    "Name a famous ship.",
    "Summarize our chat.",
]


async def socket_conversation(port: int, turns: int, tokens: int) -> list[tuple[float, float]]:
    """(TTFT, whole turn) of each turn of the conversation over one WebSocket."""
    import trio
    from trio_websocket import open_websocket_url

    rows = []
    async with open_websocket_url(f"ws://127.0.0.1:{port}/v1/responses") as ws:
        previous = None
        for i in range(turns):
            request = {
                "type": "response.create",
                "model": MODEL,
                "input": QUESTIONS[i % len(QUESTIONS)],
                "max_output_tokens": tokens,
                "temperature": 0,
                "ignore_eos": True,
                "store": False,
            }
            if previous:
                request["previous_response_id"] = previous
            started = trio.current_time()
            await ws.send_message(json.dumps(request))
            first = None
            while True:
                event = json.loads(await ws.get_message())
                if event["type"] == "response.output_text.delta" and first is None:
                    first = trio.current_time() - started
                if event["type"] in ("response.completed", "response.incomplete"):
                    previous = event["response"]["id"]
                    break
            rows.append((first or 0.0, trio.current_time() - started))
    return rows


def turn(client: httpx.Client, text: str, previous: str | None, tokens: int) -> tuple[float, str, int, float]:
    body = {
        "model": MODEL,
        "input": text,
        "max_output_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    if previous:
        body["previous_response_id"] = previous
    started = time.perf_counter()
    first = None
    final = None
    with client.stream("POST", "/v1/responses", json=body) as reply:
        for line in reply.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event["type"] == "response.output_text.delta" and first is None:
                first = time.perf_counter() - started
            if event["type"] in ("response.completed", "response.incomplete"):
                final = event["response"]
    assert first is not None and final is not None
    return first, final["id"], final["usage"]["input_tokens"], time.perf_counter() - started


def engine_prefill(prompt_ids: list[int]) -> tuple[float, float]:
    """Raw engine: first step of the prompt cold, then again with it in the prefix cache."""
    import numpy as np
    import openvino as ov
    import openvino_genai

    from ovtrio.model import embedded_model_path

    config = openvino_genai.SchedulerConfig()
    config.cache_size = 1
    config.enable_prefix_caching = True
    pipe = openvino_genai.ContinuousBatchingPipeline(str(embedded_model_path()), config, "CPU")
    gen = openvino_genai.GenerationConfig()
    gen.max_new_tokens = 1
    pipe.generate([ov.Tensor(np.asarray([[1, 2, 3]], dtype=np.int64))], [gen])  # warm-up
    times = []
    for request_id in (1, 2):
        handle = pipe.add_request(request_id, ov.Tensor(np.asarray([prompt_ids], dtype=np.int64)), gen)
        started = time.perf_counter()
        while not handle.can_read():
            pipe.step()
        times.append(time.perf_counter() - started)
        while pipe.has_non_finished_requests():
            pipe.step()
    return times[0], times[1]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=32)


def run(args: argparse.Namespace) -> Outcome:
    import trio

    with serving(["--log-level", "warning"]) as server:
        with httpx.Client(base_url=server.base_url, timeout=120) as client:
            turn(client, "Hello", None, 4)  # warm-up
            rows = []
            previous = None
            for i in range(args.turns):
                ttft, previous, input_tokens, whole = turn(client, QUESTIONS[i % len(QUESTIONS)], previous, args.tokens)
                rows.append((i + 1, input_tokens, ttft, whole))
        socket_rows = trio.run(socket_conversation, server.port, args.turns, args.tokens)

    print(
        f"ovtrio chained conversation: {args.turns} turns, {args.tokens} output tokens each, streamed, "
        "previous_response_id, SmolLM2-135M-Instruct, CPU"
    )
    print(f"{'turn':>4} {'input tokens':>12} {'HTTP TTFT':>10} {'HTTP turn':>10} {'WS TTFT':>9} {'WS turn':>9}")
    for (number, input_tokens, ttft, whole), (ws_ttft, ws_whole) in zip(rows, socket_rows):
        print(
            f"{number:>4} {input_tokens:>12} {ttft * 1e3:>8.1f}ms {whole * 1e3:>8.1f}ms"
            f" {ws_ttft * 1e3:>7.1f}ms {ws_whole * 1e3:>7.1f}ms"
        )
    first, final = rows[0][2], rows[-1][2]
    print(
        f"TTFT turn {rows[-1][0]} / turn 1: {final / first:.2f} with {rows[-1][1] / rows[0][1]:.1f}x the input tokens"
    )
    # Raw engine on a prompt as long as the last turn's: cold, and with it cached.
    prompt = [504] * rows[-1][1]
    cold, cached = engine_prefill(prompt)
    print(
        f"raw engine prefill of a {len(prompt)}-token prompt: cold {cold * 1e3:.1f} ms, cached {cached * 1e3:.1f} ms;"
        f" server turn {rows[-1][0]} TTFT / engine cached prefill: {final / cached:.2f}"
    )
    print(
        f"median TTFT over turns: HTTP {statistics.median(r[2] for r in rows) * 1e3:.1f} ms,"
        f" WebSocket {statistics.median(r[0] for r in socket_rows) * 1e3:.1f} ms;"
        f" median turn: HTTP {statistics.median(r[3] for r in rows) * 1e3:.1f} ms,"
        f" WebSocket {statistics.median(r[1] for r in socket_rows) * 1e3:.1f} ms"
    )
    summary = {
        "turn 1 TTFT ms": first * 1e3,
        f"turn {rows[-1][0]} TTFT ms": final * 1e3,
        f"turn {rows[-1][0]} / turn 1 TTFT": final / first,
        f"turn {rows[-1][0]} / turn 1 input tokens": rows[-1][1] / rows[0][1],
        "engine cold prefill ms": cold * 1e3,
        "engine cached prefill ms": cached * 1e3,
        "median TTFT ms, HTTP": statistics.median(r[2] for r in rows) * 1e3,
        "median TTFT ms, WebSocket": statistics.median(r[0] for r in socket_rows) * 1e3,
        "median turn ms, HTTP": statistics.median(r[3] for r in rows) * 1e3,
        "median turn ms, WebSocket": statistics.median(r[1] for r in socket_rows) * 1e3,
    }
    samples = {
        "http": [dict(zip(("turn", "input_tokens", "ttft_s", "turn_s"), row)) for row in rows],
        "websocket": [dict(zip(("ttft_s", "turn_s"), row)) for row in socket_rows],
    }
    return Outcome(summary, samples)
