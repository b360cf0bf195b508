"""Where one stream's time to first token goes, beside llama-server's for the same prompt.

For a GGUF model (default: the embedded one) and the peer scenario's prompt at concurrency 1
("Write a short story about a dragon.", sent again and again, so both servers find it in
their prefix caches), and a new prompt each round (another topic: nothing cached but the
chat template's head), one request at a time:

1. the server: `ovtrio serve` as the peer scenario starts it, the prompt streamed with
   the peer scenario's settings (greedy, ignore_eos, 32 tokens). Its /metrics read before and
   after each request split the client's TTFT: submission to the first token read off
   the engine (`vllm:time_to_first_token_seconds`), of it the wait to be added to the
   engine (`vllm:request_queue_time_seconds`), the rest being the first step; outside
   the scheduler, HTTP, the JSON body, the chat template and tokenizing, then
   detokenizing and writing the first SSE chunk. Also the first request of settings
   never stepped before (its sampler state is built in its first step, GIL-free like
   every other: ovtrio/scheduler/stepping.py), against the same request once more;
2. llama-server (when bench.build_llama_server has built it): the client's TTFT, and
   its own `timings`: how many prompt tokens it evaluated (the rest came from its slots'
   cache) and in how long;
3. the engine in this process, on ovtrio's converted model with the server's settings:
   `ContinuousBatchingPipeline` (add_request, then step() until the handle holds the
   first token; then one decode step), taking its turn in each round with the above;
   after the rounds, each compiled alone, the stateful `LLMPipeline` (generate() until
   its streamer gets the first token) and the bare IR in plain `infer()` calls: the
   prompt at once (the prefill), the prompt's tokens past its last whole KV block
   (what the engine computes for a prompt its prefix cache holds) and one token (a
   decode step), each split by kernel group with PERF_COUNT.

The parts of a round run in a shuffled order; the figures are medians of the rounds.

    python -m bench first_token [--model embedded|file.gguf ...] [--rounds 9]
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import trio

from bench.build_llama_server import binary_path
from bench.driver.hardware import describe_cpu, gguf_path
from bench.driver.requests import TOPICS, chat_request, prompts
from bench.driver.results import Outcome
from bench.driver.server import free_port, served_model_id, stop, wait_ready
from bench.scenarios.decode_profile import Decoder, kernel_group
from bench.scenarios.peer import start_llama_server, start_ovtrio

TOKENS = 32
PAUSE = 0.2  # seconds between parts
BLOCK_TOKENS = 32  # the engine's KV block on CPU: its prefix cache keeps whole blocks
PROMPT = prompts(1)[0]  # what the peer scenario sends at concurrency 1
# Sampling settings never stepped before: each subset builds another sampler state.
NEW_SETTINGS = (("presence_penalty", 0.1), ("frequency_penalty", 0.1), ("repetition_penalty", 1.05), ("logprobs", True))

Row = dict[str, float]


def new_prompt(turn: int) -> str:
    return f"Write a short story about {TOPICS[1 + turn % (len(TOPICS) - 1)]}."


# ---- the engine in this process --------------------------------------------------------------


class Engine:
    """ovtrio's pipelines for `gguf`, loaded as the server loads them, and the bare IR."""

    def __init__(self, gguf: Path) -> None:
        from ovtrio.loading.load import load_model
        from ovtrio.model.source import resolve_model
        from ovtrio.settings.server import Settings

        self._settings = Settings(model=str(gguf))
        model = load_model(resolve_model(self._settings), self._settings)
        self.batching, self.tokenizer = model.pipeline, model.tokenizer
        assert model.model_xml is not None
        self._model_xml = model.model_xml
        self._ids = 0

    def alone(self, rounds: int, ids: list[int]) -> dict[str, list[Row]]:
        """The stateful pipeline, then the bare IR, each compiled alone once the
        continuous-batching pipeline is gone (CPU streams of several compiled models in
        one process slowed each other's steps by up to 2x here): `rounds` of each."""
        import gc

        from ovtrio.loading.load import load_model
        from ovtrio.model.source import resolve_model

        self.batching = None
        gc.collect()
        stateful = self._settings.model_copy(update={"backend": "stateful"})
        self.stateful = load_model(resolve_model(stateful), stateful).pipeline
        rows: dict[str, list[Row]] = {"stateful": []}
        for turn in range(rounds + 1):  # the first compiles the shapes
            first = self.stateful_first(ids)
            if turn:
                rows["stateful"].append({"ms": first})
        del self.stateful
        gc.collect()
        self.ir = Decoder(self._model_xml, {"PERF_COUNT": True})
        self._infers, self._totals = 0, {}
        self.ir_steps(ids)
        rows["ir"] = [self.ir_steps(ids) for _ in range(rounds)]
        del self.ir
        return rows

    def chat_ids(self, text: str) -> list[int]:
        """The prompt as the server makes it: chat template, then tokens."""
        prompt = self.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        return [int(i) for i in self.tokenizer.encode(prompt, add_special_tokens=False).input_ids.data[0]]

    def _config(self) -> Any:
        import openvino_genai

        config = openvino_genai.GenerationConfig()
        config.max_new_tokens = TOKENS
        config.ignore_eos = True
        config.do_sample = False
        return config

    def batching_first(self, ids: list[int]) -> tuple[float, float]:
        """ContinuousBatchingPipeline: add_request + step() until the first token (ms),
        then one decode step (ms)."""
        from ovtrio.engine.tensors import prompt_tensor

        self._ids += 1
        started = time.perf_counter()
        handle = self.batching.add_request(self._ids, prompt_tensor(ids), self._config())
        while not handle.can_read():
            self.batching.step()
        first = time.perf_counter()
        handle.read()
        self.batching.step()
        decode = time.perf_counter() - first
        handle.cancel()
        while self.batching.has_non_finished_requests():
            self.batching.step()
        return (first - started) * 1e3, decode * 1e3

    def stateful_first(self, ids: list[int]) -> float:
        """LLMPipeline: generate() until its streamer gets the first token (ms)."""
        import openvino_genai

        from ovtrio.engine.tensors import prompt_tensor

        cancel = openvino_genai.StreamingStatus.CANCEL
        arrived: list[float] = []

        class First(openvino_genai.StreamerBase):
            def write(self, token: Any) -> Any:
                arrived.append(time.perf_counter())
                return cancel

            def end(self) -> None:
                pass

        started = time.perf_counter()
        self.stateful.generate(prompt_tensor(ids), self._config(), streamer=First())
        return (arrived[0] - started) * 1e3

    def ir_steps(self, ids: list[int]) -> Row:
        """The bare IR, each infer() in ms and its kernel time by group: the prompt at
        once ("prefill"), one more token ("decode"), and the prompt again in two calls,
        the second one its tokens past the last whole KV block ("tail"): what the engine
        computes for a prompt whose whole blocks its prefix cache holds."""
        row: Row = {}
        request = self.ir.request

        def infer(name: str, tokens: list[int], start: int) -> None:
            started = time.perf_counter()
            request.infer(Decoder._inputs(np.array([tokens], dtype=np.int64), start, start + len(tokens)))
            row[name] = (time.perf_counter() - started) * 1e3
            # The plugin reports each node's mean over every infer() since it compiled:
            # this one's time is the change of mean x count.
            self._infers += 1
            totals = {group: ms * self._infers for group, ms in by_group(request.profiling_info).items()}
            row.update({f"{name} {group}": total - self._totals.get(group, 0.0) for group, total in totals.items()})
            self._totals = totals

        request.reset_state()
        infer("prefill", ids, 0)
        infer("decode", [int(request.get_tensor("logits").data[0, -1].argmax())], len(ids))
        cached = (len(ids) - 1) // BLOCK_TOKENS * BLOCK_TOKENS
        if cached:
            request.reset_state()
            infer("cached", ids[:cached], 0)
            infer("tail", ids[cached:], cached)
            row["tail tokens"] = len(ids) - cached
        return row


def in_engine(run: Callable[[], Any]) -> Callable[[], Awaitable[Row]]:
    """An engine part as the rounds run it (blocking the event loop: nothing else runs)."""

    async def part() -> Row:
        result = run()
        return result if isinstance(result, dict) else {"first": result[0], "decode": result[1]}

    return part


def by_group(profiling_info: Any) -> dict[str, float]:
    groups: dict[str, float] = defaultdict(float)
    for info in profiling_info:
        groups[kernel_group(info.node_type, info.exec_type, info.node_name)] += info.real_time.total_seconds() * 1e3
    return dict(groups)


# ---- the servers -----------------------------------------------------------------------------


async def stream_once(port: int, model: str, text: str, tokens: int, **extra: Any) -> tuple[float, bytes]:
    """One streamed chat completion (the peer scenario's settings, plus `extra`): the client's
    TTFT in ms (request sent to the first chunk with content), and the whole reply."""
    request = chat_request(model, text, tokens, **extra)
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    first: float | None = None
    reply = b""
    async with stream:
        started = time.perf_counter()
        await stream.send_all(request)
        while data := await stream.receive_some(65536):
            if first is None and b'"delta":{"content":"' in reply[-64:] + data:
                first = time.perf_counter()
            reply += data
            if b"data: [DONE]" in reply[-64:]:
                break
    if first is None:
        raise RuntimeError(f"no content streamed: {reply[-300:]!r}")
    return (first - started) * 1e3, reply


def reply_number(reply: bytes, field: str) -> float:
    """The last `"field": number` of a reply (usage, timings)."""
    found = re.findall(rb'"' + field.encode() + rb'":\s*(-?[0-9.eE+-]+)', reply)
    return float(found[-1]) if found else float("nan")


async def metrics(port: int) -> dict[str, float]:
    """The server's /metrics, each series summed over its labels."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    reply = b""
    async with stream:
        await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        while data := await stream.receive_some(65536):
            reply += data
    values: dict[str, float] = defaultdict(float)
    for line in reply.decode().split("\r\n\r\n", 1)[-1].splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name.split("{", 1)[0]] += float(value)
    return values


async def ovtrio_request(port: int, model: str, text: str, tokens: int, **extra: Any) -> Row:
    """The client's TTFT, and the server's split of it from its /metrics (ms)."""
    before = await metrics(port)
    ttft, _ = await stream_once(port, model, text, tokens, **extra)
    after = await metrics(port)

    def delta(name: str) -> float:
        return (after[name] - before[name]) * 1e3

    in_server = delta("vllm:time_to_first_token_seconds_sum")
    return {
        "client": ttft,
        "in_server": in_server,
        "outside": ttft - in_server,
        "queue": delta("vllm:request_queue_time_seconds_sum"),
        "added": in_server - delta("vllm:request_queue_time_seconds_sum"),
        "prompt_tokens": delta("vllm:request_prompt_tokens_sum") / 1e3,
    }


async def llama_request(port: int, model: str, text: str) -> Row:
    ttft, reply = await stream_once(port, model, text, TOKENS)
    return {
        "client": ttft,
        "prompt_tokens": reply_number(reply, "prompt_tokens"),
        "evaluated": reply_number(reply, "prompt_n"),
        "prompt_ms": reply_number(reply, "prompt_ms"),
        "decode_ms": reply_number(reply, "predicted_per_token_ms"),
    }


# ---- the rounds ------------------------------------------------------------------------------


async def measure(args: argparse.Namespace, gguf: Path, engine: Engine) -> dict[str, list[Row]]:
    rows: dict[str, list[Row]] = defaultdict(list)
    processes = []
    try:
        port = free_port()
        processes.append(start_ovtrio(gguf, port))
        await wait_ready(port, processes[-1])
        model = await served_model_id(port)
        llama_port = None
        if binary_path().exists():
            llama_port = free_port()
            processes.append(start_llama_server(binary_path(), gguf, llama_port))
            await wait_ready(llama_port, processes[-1], b"/health")
        else:
            print(f"llama-server not built ({binary_path()} missing; run bench.build_llama_server)")
        seen = engine.chat_ids(PROMPT)
        for warm in (PROMPT, "Hello!"):  # compile the shapes, cache the prompt, prove the settings
            engine.batching_first(engine.chat_ids(warm))
            await stream_once(port, model, warm, TOKENS)
            if llama_port is not None:
                await stream_once(llama_port, model, warm, TOKENS)
        subsets = [dict(s for bit, s in enumerate(NEW_SETTINGS) if mask >> bit & 1) for mask in range(1, 16)]
        for turn in range(args.rounds):
            fresh = new_prompt(turn)
            fresh_ids = engine.chat_ids(fresh)
            parts: dict[str, Callable[[], Awaitable[Row]]] = {
                "engine seen": in_engine(partial(engine.batching_first, seen)),
                "engine new": in_engine(partial(engine.batching_first, fresh_ids)),
                "ovtrio seen": partial(ovtrio_request, port, model, PROMPT, TOKENS),
                "ovtrio new": partial(ovtrio_request, port, model, fresh, TOKENS),
            }
            if turn < len(subsets):
                settings = subsets[turn]
                parts["new settings"] = partial(ovtrio_request, port, model, PROMPT, TOKENS, **settings)
            if llama_port is not None:
                parts["llama seen"] = partial(llama_request, llama_port, model, PROMPT)
                parts["llama new"] = partial(llama_request, llama_port, model, fresh)
            order = list(parts)
            random.Random(turn).shuffle(order)
            for name in order:
                await trio.sleep(PAUSE)  # the last part's spinning threads go to sleep
                rows[name].append(await parts[name]())
                if name == "new settings":  # the same settings once more, now stepped
                    rows["settings seen"].append(await parts[name]())
        rows["prompt"] = [{"seen": len(seen), "new": len(fresh_ids)}]
    finally:
        for process in processes:
            stop(process, 30)
    rows.update(engine.alone(args.rounds, seen))
    return rows


def median(rows: dict[str, list[Row]], part: str, key: str) -> float:
    values = [row[key] for row in rows.get(part, []) if key in row]
    return statistics.median(values) if values else float("nan")


def report(gguf: Path, rows: dict[str, list[Row]], rounds: int) -> None:
    def m(part: str, key: str) -> float:
        return median(rows, part, key)

    tokens = rows["prompt"][0]
    print(
        f"\n{gguf.name}: {PROMPT!r} ({tokens['seen']:.0f} tokens after the chat template; new prompts"
        f" {tokens['new']:.0f}), {TOKENS} tokens, greedy; ms, medians of {rounds} rounds"
    )
    print(f"{'':58} {'seen prompt':>11} {'new prompt':>10}")

    def line(label: str, seen: float, new: float = float("nan")) -> None:
        right = f"{new:10.1f}" if new == new else f"{'':10}"
        print(f"{label:<58} {seen:11.1f} {right}")

    def both(label: str, part: str, key: str) -> None:
        line(label, m(f"{part} seen", key), m(f"{part} new", key))

    both("ovtrio: client's TTFT", "ovtrio", "client")
    both("  in the scheduler: submitted -> first token read", "ovtrio", "in_server")
    both("    submitted -> added to the engine", "ovtrio", "queue")
    both("    added -> first token read (the first step)", "ovtrio", "added")
    both("  outside it: HTTP, JSON, template, tokens; the SSE chunk", "ovtrio", "outside")
    if rows.get("llama seen"):
        both("llama-server: client's TTFT", "llama", "client")
        both("  its prompt evaluation (timings.prompt_ms)", "llama", "prompt_ms")
        both("    of prompt tokens (timings.prompt_n)", "llama", "evaluated")
        both("    prompt tokens (usage)", "llama", "prompt_tokens")
        line("  one decode step (timings.predicted_per_token_ms)", m("llama seen", "decode_ms"))
    both("engine: ContinuousBatchingPipeline, add_request -> token", "engine", "first")
    both("  one decode step after it", "engine", "decode")
    line("engine: LLMPipeline, generate() -> streamer's first token", m("stateful", "ms"))
    tail = m("ir", "tail tokens")
    line(f"IR alone: infer() of the {tokens['seen']:.0f} prompt tokens at once", m("ir", "prefill"))
    cached = tokens["seen"] - tail
    line(f"  infer() of its last {tail:.0f} after the first {cached:.0f} (prefix-cached)", m("ir", "tail"))
    line("  infer() of one token (a decode step)", m("ir", "decode"))
    steps = ("prefill", "tail", "decode")
    groups = {key.split(" ", 1)[1] for row in rows["ir"] for key in row if " " in key and key.split(" ", 1)[0] in steps}
    groups.discard("tokens")
    print(f"IR alone, kernel time by group (ms):  {'prompt':>8} {'its tail':>8} {'1 token':>8}")
    for group in sorted(groups, key=lambda g: -m("ir", f"prefill {g}")):
        print(f"  {group:<36}" + "".join(f"{m('ir', f'{step} {group}'):9.1f}" for step in steps))
    if rows.get("new settings"):
        new, again = rows["new settings"], rows["settings seen"]
        extra = statistics.median(a["client"] - b["client"] for a, b in zip(new, again))
        print(
            f"settings never stepped before: client's TTFT {m('new settings', 'client'):.1f},"
            f" the same request again {m('settings seen', 'client'):.1f} (difference, median of pairs: {extra:+.1f})"
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", nargs="+", default=["embedded"], help="GGUF files ('embedded': the embedded model)")
    parser.add_argument("--rounds", type=int, default=9)


def run(args: argparse.Namespace) -> Outcome:
    print(f"cpu: {describe_cpu()}")
    summary: dict[str, float] = {}
    samples = {}
    for gguf in map(gguf_path, args.model):
        engine = Engine(gguf)
        rows = trio.run(measure, args, gguf, engine)
        report(gguf, rows, args.rounds)
        del engine
        samples[gguf.name] = rows
        for part in ("ovtrio", "llama", "engine"):
            for prompt in ("seen", "new"):
                key = "first" if part == "engine" else "client"
                if rows.get(f"{part} {prompt}"):
                    summary[f"{gguf.name}: {part} TTFT ms, {prompt} prompt"] = median(rows, f"{part} {prompt}", key)
        summary[f"{gguf.name}: ovtrio outside the scheduler ms, seen prompt"] = median(rows, "ovtrio seen", "outside")
    return Outcome(summary, samples)
