"""Where one stream's decode time goes: the model's kernels alone, the engine, the ceiling.

For a GGUF model (default: the embedded one), in one process:

1. the converted IR (ovtrio's model cache entry; converted first if missing) run alone
   with plain OpenVINO: a stateful `infer()` loop, one token per call, greedy. This is
   the CPU plugin's kernels with nothing of GenAI's pipeline around them; with
   `PERF_COUNT` on, the time of one decode step is split by kernel type (matmuls,
   attention, everything else);
2. the same folder through GenAI: `ContinuousBatchingPipeline` (what ovtrio serves
   with) and the stateful `LLMPipeline`, decode tok/s of one request;
3. the bandwidth ceiling (bench/driver/hardware.py): read bandwidth over weight bytes per token.

    python -m bench decode_profile [--model embedded|file.gguf] [--tokens 48] [--repeats 3]

Prints decode tok/s of each and its share of the ceiling, then the kernel profile.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov

from bench.driver.hardware import ceiling_tok_s, describe_cpu, gguf_path, read_bandwidth_gb_s
from bench.driver.results import Outcome

PROMPT_TOKENS = 16


def converted_folder(gguf: Path) -> Path:
    """The model cache entry ovtrio serves `gguf` from, converting it first if needed."""
    from ovtrio.gguf.cache import ModelCache, cache_folder, engine_versions, entry_key, model_identity

    cache = ModelCache(cache_folder(None, None))
    key = entry_key(model_identity(gguf), engine_versions())
    folder = cache.lookup(key)
    if folder is None:
        subprocess.run([sys.executable, "-m", "ovtrio", "convert", "--model", str(gguf)], check=True)
        folder = cache.lookup(key)
    assert folder is not None
    return folder


def kernel_group(node_type: str, exec_type: str, name: str) -> str:
    """One of a few groups a reader can act on, from the plugin's node and kernel names."""
    kind = f"{node_type} {exec_type} {name}".lower()
    if "fullyconnected" in kind or "matmul" in kind:
        return "matmuls (weights)"
    if "scaleddotproduct" in kind or "sdpa" in kind or "pagedattention" in kind:
        return "attention"
    if "rms" in kind or "norm" in kind:
        return "norms"
    if "rope" in kind:
        return "rotary embedding"
    if "gather" in kind:
        return "embedding lookup"
    return "other"


class Decoder:
    """A compiled model's stateful infer() loop, one token a call, greedy."""

    def __init__(self, model: ov.Model | Path, config: dict[str, Any] | None = None) -> None:
        self.request = ov.Core().compile_model(model, "CPU", config or {}).create_infer_request()

    def run(self, prompt: np.ndarray, tokens: int) -> tuple[float, np.ndarray]:
        """Decode tok/s after `prompt`, and the log-softmax at each of its positions."""
        self.request.reset_state()
        length = prompt.shape[1]
        self.request.infer(self._inputs(prompt, 0, length))
        logits = self.request.get_tensor("logits").data[0].astype(np.float64)
        shifted = logits - logits.max(axis=-1, keepdims=True)
        prompt_logprobs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
        next_id = int(logits[-1].argmax())
        started = time.perf_counter()
        for _ in range(tokens):
            self.request.infer(self._inputs(np.array([[next_id]], dtype=np.int64), length, length + 1))
            length += 1
            next_id = int(self.request.get_tensor("logits").data[0, -1].argmax())
        return tokens / (time.perf_counter() - started), prompt_logprobs

    @staticmethod
    def _inputs(ids: np.ndarray, start: int, end: int) -> dict[str, np.ndarray]:
        return {
            "input_ids": ids,
            "attention_mask": np.ones((1, end), dtype=np.int64),
            "position_ids": np.arange(start, end, dtype=np.int64)[None, :],
            "beam_idx": np.zeros(1, dtype=np.int32),
        }


def plain_decode(folder: Path, tokens: int, repeats: int) -> tuple[float, dict[str, float]]:
    """Decode tok/s of the bare IR (median of `repeats`), and one step's time by group (us)."""
    decoder = Decoder(folder / "openvino_model.xml", {"PERF_COUNT": True})
    prompt = np.arange(1, PROMPT_TOKENS + 1, dtype=np.int64)[None, :]
    rates = [decoder.run(prompt, tokens)[0] for _ in range(repeats)]
    # The plugin reports each node's mean over every infer() since it compiled (the
    # compiling first one and the prompts included): one more decode step's time is the
    # change of mean x count.
    infers = repeats * (1 + tokens)
    before = _group_means(decoder.request.profiling_info)
    length = PROMPT_TOKENS + tokens
    decoder.request.infer(Decoder._inputs(np.array([[1]], dtype=np.int64), length, length + 1))
    after = _group_means(decoder.request.profiling_info)
    profile = {group: after[group] * (infers + 1) - before.get(group, 0.0) * infers for group in after}
    return statistics.median(rates), profile


def _group_means(profiling_info: Any) -> dict[str, float]:
    """The plugin's mean time per infer() of each kernel group, in us."""
    groups: dict[str, float] = defaultdict(float)
    for info in profiling_info:
        groups[kernel_group(info.node_type, info.exec_type, info.node_name)] += info.real_time.total_seconds() * 1e6
    return dict(groups)


def engine_decode(folder: Path, tokens: int, repeats: int, stateful: bool) -> float:
    """Decode tok/s of one request through GenAI: (t(1 + tokens) - t(1)) over tokens."""
    import openvino_genai as genai

    if stateful:
        pipeline = genai.LLMPipeline(str(folder), "CPU")
    else:
        scheduler = genai.SchedulerConfig()
        scheduler.cache_size = 1
        pipeline = genai.ContinuousBatchingPipeline(str(folder), scheduler, "CPU")
    prompt = "Write a long story about a lighthouse keeper and the sea."

    def run(new_tokens: int) -> float:
        config = genai.GenerationConfig()
        config.max_new_tokens = new_tokens
        config.ignore_eos = True
        started = time.perf_counter()
        if stateful:
            pipeline.generate(prompt, config)
        else:
            pipeline.generate([prompt], [config])
        return time.perf_counter() - started

    run(4)  # compile the shapes
    rates = []
    for _ in range(repeats):
        first = run(1)
        whole = run(1 + tokens)
        rates.append(tokens / (whole - first))
    return statistics.median(rates)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="embedded", help="a GGUF file ('embedded': the embedded model)")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)


def run(args: argparse.Namespace) -> Outcome:
    gguf = gguf_path(args.model)
    folder = converted_folder(gguf)
    bandwidth = read_bandwidth_gb_s()
    ceiling = ceiling_tok_s(gguf, bandwidth)
    print(f"cpu: {describe_cpu()}; read bandwidth {bandwidth:.1f} GB/s")
    print(
        f"{gguf.name}: one stream's ceiling {ceiling:.0f} tok/s; {args.tokens} decode tokens, medians of {args.repeats}"
    )
    plain, profile = plain_decode(folder, args.tokens, args.repeats)
    batching = engine_decode(folder, args.tokens, args.repeats, stateful=False)
    stateful = engine_decode(folder, args.tokens, args.repeats, stateful=True)
    for name, rate in (
        ("IR alone, plain infer() loop", plain),
        ("ContinuousBatchingPipeline", batching),
        ("LLMPipeline (stateful)", stateful),
    ):
        print(f"  {name:<30} {rate:7.1f} tok/s  {rate / ceiling:5.2f} of the ceiling")
    total = sum(profile.values())
    print(f"one decode step of the IR alone, by kernel ({total / 1e3:.2f} ms of kernel time):")
    for group, micros in sorted(profile.items(), key=lambda item: -item[1]):
        print(f"  {group:<20} {micros / 1e3:7.2f} ms  {micros / total:5.1%}")
    summary = {
        "read bandwidth GB/s": bandwidth,
        "one stream's ceiling tok/s": ceiling,
        "IR alone tok/s": plain,
        "ContinuousBatchingPipeline tok/s": batching,
        "LLMPipeline tok/s": stateful,
        "IR alone / ceiling": plain / ceiling,
    }
    summary |= {f"decode step kernels, {group} ms": micros / 1e3 for group, micros in profile.items()}
    return Outcome(summary, {"kernel_us": profile}, "" if args.model == "embedded" else gguf.name)
