"""The engine's prefill speed against the step's token budget: what slice size runs fastest.

    python -m bench prefill_curve [--model embedded|file.gguf] [--prompt 8000]
                                  [--budgets 256 512 1024 2048 4096 8192] [--turns 3]

For each budget, a ContinuousBatchingPipeline built with `max_num_batched_tokens` set to
it (prefix caching off, so every prompt is computed afresh) prefills one prompt of
`--prompt` random token ids alone: the engine splits it into chunks of the budget, one a
step, the way ovtrio's scheduler slices a long prompt. The figure is the prompt's
tokens over the time from `add_request` to its first token, and the steps it took;
the budgets take turns (each turn measures every budget once, in alternating order)
and each figure is the median of the turns. The scheduler's prefill policy
(ovtrio/scheduler/prefill_policy.py) prefills a prompt alone in slices of the size
that runs fastest here.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.driver.hardware import describe_cpu, gguf_path
from bench.driver.results import Outcome
from bench.driver.turns import take_turns

# Prompt ids are drawn from these: past the special tokens at the start of the embedded
# model's vocabulary, and within any vocabulary of 32,000 ids or more.
FIRST_ORDINARY_ID = 256
LAST_ID = 32000


def pipeline(model: str, budget: int) -> Any:
    import openvino_genai

    config = openvino_genai.SchedulerConfig()
    config.cache_size = 1
    config.enable_prefix_caching = False
    config.max_num_batched_tokens = budget
    config.max_num_seqs = 8
    config.dynamic_split_fuse = True
    return openvino_genai.ContinuousBatchingPipeline(model, config, "CPU")


def prefill_seconds(pipe: Any, prompt: list[int]) -> tuple[float, int]:
    """Seconds from add_request to the first token of `prompt`, alone, and the steps."""
    import openvino_genai

    from ovtrio.engine.tensors import prompt_tensor

    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = 1
    config.ignore_eos = True
    started = time.perf_counter()
    handle = pipe.add_request(random.randrange(1 << 30), prompt_tensor(prompt), config)
    steps = 0
    while not handle.can_read():
        pipe.step()
        steps += 1
    seconds = time.perf_counter() - started
    while pipe.has_non_finished_requests():
        pipe.step()
    return seconds, steps


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="embedded", help="a GGUF file ('embedded': the embedded model)")
    parser.add_argument("--prompt", type=int, default=8000, help="prompt tokens")
    parser.add_argument("--budgets", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192])
    parser.add_argument("--turns", type=int, default=3)


def run(args: argparse.Namespace) -> Outcome:
    model = str(gguf_path(args.model))
    print(f"cpu: {describe_cpu()}")
    pipes = {budget: pipeline(model, budget) for budget in args.budgets}
    rng = random.Random(1)

    def fresh() -> list[int]:
        return [rng.randrange(FIRST_ORDINARY_ID, LAST_ID) for _ in range(args.prompt)]

    def part(pipe: Any) -> Callable[[], tuple[float, int]]:
        return lambda: prefill_seconds(pipe, fresh())

    for pipe in pipes.values():  # warm every shape once
        prefill_seconds(pipe, fresh())
    parts = {str(budget): part(pipe) for budget, pipe in pipes.items()}
    turns = take_turns(parts, args.turns)
    summary: dict[str, float | int | str | None] = {}
    print(f"{args.prompt}-token prompt alone, prefix caching off, medians of {args.turns} turns")
    print(f"{'budget':>7} {'steps':>6} {'seconds':>8} {'tokens/s':>9}")
    samples = {}
    for budget in args.budgets:
        measured = turns[str(budget)]
        seconds = statistics.median(s for s, _ in measured)
        steps = measured[0][1]
        rate = args.prompt / seconds
        print(f"{budget:>7} {steps:>6} {seconds:>8.3f} {rate:>9.0f}")
        summary[f"prefill tok/s, budget {budget}"] = rate
        samples[budget] = measured
    fastest = max(args.budgets, key=lambda budget: summary[f"prefill tok/s, budget {budget}"] or 0)
    summary["fastest budget"] = fastest
    variant = "" if args.model == "embedded" else gguf_path(args.model).name
    return Outcome(summary, {"prompt": args.prompt, "turns": samples}, variant)
