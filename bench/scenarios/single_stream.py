"""One stream on the raw engine under different OpenVINO settings.

What a decode step's speed depends on.

    python -m bench single_stream [--model embedded] [--tokens 64] [--turns 5]

Builds a ContinuousBatchingPipeline for each setting below from the model's converted IR
(the server's model cache; the embedded model unless --model names a GGUF file), and an
LLMPipeline (the stateful backend), then lets them take turns generating one greedy
64-token reply (ignore_eos) to the same chat prompt. Prints each one's median output
tok/s and its ratio to the defaults.
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial
from pathlib import Path
from typing import Any

from bench.driver.hardware import cpu_name
from bench.driver.results import Outcome
from bench.driver.turns import take_turns

VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "f32 compute": {"INFERENCE_PRECISION_HINT": "f32"},
    "f16 KV cache": {"KV_CACHE_PRECISION": "f16"},
    "no CPU pinning": {"ENABLE_CPU_PINNING": False},
    "1 thread": {"INFERENCE_NUM_THREADS": 1},
    "dyn. quant. off": {"DYNAMIC_QUANTIZATION_GROUP_SIZE": 0},
    "dyn. quant. 128": {"DYNAMIC_QUANTIZATION_GROUP_SIZE": 128},
}


def model_folder(model: str = "embedded") -> Path:
    """The model (a GGUF file, or 'embedded') converted to IR, from (or into) the server's
    model cache."""
    from ovtrio.loading.load import load_model
    from ovtrio.model.source import resolve_model
    from ovtrio.settings.server import Settings

    settings = Settings() if model == "embedded" else Settings(model=model)
    model = load_model(resolve_model(settings), settings)
    origin = model.origin or ""
    return Path(origin.split(" in ", 1)[1])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="embedded", help="a GGUF file ('embedded': the embedded model)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--only", nargs="*", help="variants to run (default: all)")


def run(args: argparse.Namespace) -> Outcome:
    import openvino as ov
    import openvino_genai

    folder = model_folder(args.model)
    tokenizer = openvino_genai.Tokenizer(str(folder))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a short story about a lighthouse."}], add_generation_prompt=True
    )
    ids = tokenizer.encode(prompt, add_special_tokens=False).input_ids
    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = args.tokens
    config.ignore_eos = True

    pipelines: dict[str, Any] = {}
    for name, properties in VARIANTS.items():
        if args.only and name not in args.only:
            continue
        scheduler = openvino_genai.SchedulerConfig()
        scheduler.num_kv_blocks = 64
        scheduler.cache_size = 0
        scheduler.dynamic_split_fuse = True
        pipelines[name] = openvino_genai.ContinuousBatchingPipeline(
            str(folder), tokenizer, scheduler, "CPU", **properties
        )
    if not args.only or "stateful" in args.only:
        pipelines["stateful (LLMPipeline)"] = openvino_genai.LLMPipeline(str(folder), tokenizer, "CPU")

    def one(name: str, pipeline: Any) -> float:
        started = time.perf_counter()
        if name.startswith("stateful"):
            pipeline.generate(ids, config)
        else:
            pipeline.generate([ids], [config])
        return args.tokens / (time.perf_counter() - started)

    for name, pipeline in pipelines.items():
        one(name, pipeline)  # warm-up
    speeds = take_turns({name: partial(one, name, pipeline) for name, pipeline in pipelines.items()}, args.turns)
    base = statistics.median(speeds["defaults"]) if "defaults" in speeds else None
    cpu = cpu_name()
    print(f"one stream, raw engine, {args.tokens} tokens, greedy, ignore_eos; {cpu}, OpenVINO {ov.get_version()}")
    print(f"{'setting':<24} {'tok/s':>7} {'vs defaults':>11}")
    for name, values in speeds.items():
        median = statistics.median(values)
        ratio = f"{median / base:>11.2f}" if base else ""
        print(f"{name:<24} {median:>7.1f} {ratio}")
    summary = {f"{name}: tok/s": statistics.median(values) for name, values in speeds.items()}
    if base:
        summary |= {f"{name}: x defaults": statistics.median(values) / base for name, values in speeds.items()}
    return Outcome(summary, speeds, "" if args.model == "embedded" else Path(args.model).name)
