"""The scoring path's throughput beside generation's prefill, and the memory it adds.

    python -m bench scoring [--prompt-words 300] [--prompts 8] [--concurrency 1 4] [--turns 3]

Starts `ovtrio serve` with default settings (prefix cache on) as a subprocess and sends
it prompts of about the same length, each one new (distinct words from the first token
on, so the prefix cache never saves work):

- scoring: `echo` + `logprobs: 1` + `max_tokens: 0` (lm-eval's scoring request with
  nothing generated): the scoring path runs the model over the prompt and reads every
  position's log-probabilities and top token;
- prefill: the same prompts with `max_tokens: 1` and no logprobs: the engine prefills
  the prompt and writes one token.

Both in prompt tokens per second, at each concurrency, as medians of turns taken in
alternation (this machine's speed drifts), with their ratio. The memory figure is the
server's resident size once the engine has served prefill requests at every
concurrency, against the same after the first scoring request has compiled the scoring
model (it loads lazily), and after all the runs.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from bench.driver.hardware import cpu_name
from bench.driver.results import Outcome
from bench.driver.server import rss_mb, serving

WORDS = (
    "river mountain lantern copper violin harbor meadow thunder velvet orchard canyon marble ember falcon willow"
    " glacier saddle pepper compass quartz tundra banner cobalt drizzle fern garnet hammock iris jasmine kettle"
    " lagoon mosaic nectar oasis pebble quiver raven sapphire thistle umber vortex walnut yonder zephyr anchor"
    " biscuit cinder dune"
).split()


def prompt_texts(count: int, words: int, rng: random.Random) -> list[str]:
    return [f"Note {rng.random():.8f}: " + " ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(count)]


def send_all(base: str, model: str, texts: list[str], body: dict, concurrency: int) -> tuple[int, float]:
    """Send every text (at most `concurrency` at once); prompt tokens served and seconds."""

    def one(text: str) -> int:
        reply = httpx.post(f"{base}/v1/completions", json={"model": model, "prompt": text, **body}, timeout=600)
        reply.raise_for_status()
        return reply.json()["usage"]["prompt_tokens"]

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        tokens = sum(pool.map(one, texts))
    return tokens, time.perf_counter() - started


SCORING = {"echo": True, "logprobs": 1, "max_tokens": 0}
PREFILL = {"max_tokens": 1, "temperature": 0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt-words", type=int, default=300)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--server-arg", action="append", default=[], help="extra `ovtrio serve` argument")


def run(args: argparse.Namespace) -> Outcome:
    rng = random.Random(1)
    summary: dict[str, float | str] = {}
    samples: dict[int, dict[str, list[float]]] = {}
    with serving(["--log-level", "warning", *args.server_arg]) as server:
        base, process = server.base_url, server.process
        model = httpx.get(f"{base}/v1/models").json()["data"][0]["id"]
        # Warm the engine at every concurrency first, so its own growth is not counted below.
        for concurrency in args.concurrency:
            send_all(base, model, prompt_texts(args.prompts, args.prompt_words, rng), PREFILL, concurrency)
        time.sleep(1)
        before = rss_mb(process.pid)
        send_all(base, model, prompt_texts(1, args.prompt_words, rng), SCORING, 1)  # compiles the scoring model
        time.sleep(1)
        loaded = rss_mb(process.pid)
        print(f"machine: {cpu_name()}")
        print(f"prompts of ~{args.prompt_words} words, {args.prompts} per turn, {args.turns} turns, medians")
        print(f"{'concurrency':>11} {'scoring tok/s':>14} {'prefill tok/s':>14} {'ratio':>6}")
        for concurrency in args.concurrency:
            scoring, prefill = [], []
            for _ in range(args.turns):
                tokens, seconds = send_all(
                    base, model, prompt_texts(args.prompts, args.prompt_words, rng), SCORING, concurrency
                )
                scoring.append(tokens / seconds)
                tokens, seconds = send_all(
                    base, model, prompt_texts(args.prompts, args.prompt_words, rng), PREFILL, concurrency
                )
                prefill.append(tokens / seconds)
            s, p = statistics.median(scoring), statistics.median(prefill)
            print(f"{concurrency:>11} {s:>14.0f} {p:>14.0f} {s / p:>6.2f}")
            samples[concurrency] = {"scoring_tok_s": scoring, "prefill_tok_s": prefill}
            summary[f"scoring tok/s, concurrency {concurrency}"] = s
            summary[f"prefill tok/s, concurrency {concurrency}"] = p
            summary[f"scoring / prefill, concurrency {concurrency}"] = s / p
        after = rss_mb(process.pid)
        print(
            f"server RSS: {before:.0f} MB before scoring, {loaded:.0f} MB once the scoring model is loaded"
            f" (+{loaded - before:.0f} MB), {after:.0f} MB after the runs (+{after - before:.0f} MB)"
        )
    summary["RSS added by the scoring model MB"] = loaded - before
    summary["RSS added after the runs MB"] = after - before
    return Outcome(summary, samples)
