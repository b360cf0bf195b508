"""Single-stream speed of speculative decoding on a repetitive workload.

The workload asks the model to copy a long given passage of code, greedy, so most of
the output is already in the prompt: where prompt lookup should pay. In one run it
measures, for plain decoding, prompt lookup and the embedded model as its own draft:

- the raw engine (ContinuousBatchingPipeline.generate() on the same token ids), and
- the server (`ovtrio serve`, a streamed completions request over HTTP),

taking turns (plain, prompt lookup, draft, again) and reporting medians, and checks that
every variant wrote the same greedy text as plain decoding in the same place. With
`--exact`, everything runs with the settings under which speculation writes exactly
plain decoding's greedy text (f32 compute and KV cache, dynamic quantization off; slower
in absolute terms on CPUs that compute in bf16).

    python -m bench speculative [--turns 5] [--tokens 128] [--exact]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time

import httpx
import numpy as np

from bench.driver import server as servers
from bench.driver.hardware import cpu_name
from bench.driver.results import Outcome
from ovtrio.loading import load_model
from ovtrio.model import embedded_model_path, resolve_model
from ovtrio.settings.server import Settings

PASSAGE = "".join(
    f"def op_{i}(values, factor):\n    total = 0\n    for value in values:\n        total += value * factor + {i}\n"
    f"    return total\n\n"
    for i in range(8)
)
PROMPT = f"Rewrite this code exactly as it is:\n\n{PASSAGE}\nHere it is again:\n\n"
VARIANTS = {
    "plain": [],
    "prompt lookup": ["--prompt-lookup"],
    "draft model": ["--draft-model", str(embedded_model_path())],
}
ARITHMETIC = ["--no-enable-prefix-caching"]
EXACT = {
    "inference_precision": "f32",
    "kv_cache_precision": "f32",
    "plugin_config": {"DYNAMIC_QUANTIZATION_GROUP_SIZE": 0},
}
EXACT_FLAGS = [
    "--inference-precision",
    "f32",
    "--kv-cache-precision",
    "f32",
    "--plugin-config",
    json.dumps(EXACT["plugin_config"]),
]


def start_server(flags: list[str]) -> tuple[subprocess.Popen, str]:
    server = servers.start([*ARITHMETIC, *flags])
    servers.ready_by_http(server.port, lambda: server.process.poll() is None)
    return server.process, server.base_url


def server_run(url: str, prompt_ids: list[int], tokens: int) -> tuple[float, str]:
    body = {
        "model": "SmolLM2-135M-Instruct",
        "prompt": prompt_ids,
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    text, first, last = [], None, None
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as reply:
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["text"]:
                now = time.perf_counter()
                first = first or now
                last = now
                text.append(chunk["choices"][0]["text"])
    # Decode speed after the first token, as the engine's: the prefill is the same for all.
    return (tokens - 1) / (last - first), "".join(text)


def engine_pipeline(flags: list[str], exact: bool):
    settings = Settings(
        **(EXACT if exact else {}),
        enable_prefix_caching=False,
        prompt_lookup="--prompt-lookup" in flags,
        draft_model=flags[1] if flags[:1] == ["--draft-model"] else None,
    )
    model = load_model(resolve_model(settings), settings)
    return model


def engine_run(model, prompt_ids: list[int], tokens: int) -> tuple[float, str]:
    import openvino as ov
    import openvino_genai

    from ovtrio.loading.speculation import apply_defaults

    config = apply_defaults(openvino_genai.GenerationConfig(), model.speculation)
    config.max_new_tokens = tokens
    config.ignore_eos = True
    config.do_sample = False
    prompt = ov.Tensor(np.asarray([prompt_ids], dtype=np.int64))
    one = apply_defaults(openvino_genai.GenerationConfig(), model.speculation)
    one.max_new_tokens = 1
    one.do_sample = False
    started = time.perf_counter()
    model.pipeline.generate([prompt], [one])  # the prefill alone, to take it out
    prefill = time.perf_counter() - started
    started = time.perf_counter()
    (result,) = model.pipeline.generate([prompt], [config])
    elapsed = time.perf_counter() - started - prefill
    return (tokens - 1) / elapsed, model.tokenizer.decode(list(result.m_generation_ids[0]))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--exact", action="store_true", help="f32, f32 KV cache, no dynamic quantization")


def run(args: argparse.Namespace) -> Outcome:
    engines = {name: engine_pipeline(flags, args.exact) for name, flags in VARIANTS.items()}
    prompt_ids = list(engines["plain"].tokenizer.encode(PROMPT).input_ids.data[0])
    prompt_ids = [int(i) for i in prompt_ids]
    started = {name: start_server(flags + (EXACT_FLAGS if args.exact else [])) for name, flags in VARIANTS.items()}
    speeds: dict[tuple[str, str], list[float]] = {}
    texts: dict[tuple[str, str], set[str]] = {}
    try:
        for _ in range(args.turns):
            for name in VARIANTS:
                for where, measure, target in (
                    ("engine", engine_run, engines[name]),
                    ("server", server_run, started[name][1]),
                ):
                    speed, text = measure(target, prompt_ids, args.tokens)
                    speeds.setdefault((where, name), []).append(speed)
                    texts.setdefault((where, name), set()).add(text)
    finally:
        for process, _ in started.values():
            servers.stop(process, 30)

    cpu = cpu_name()
    print(f"speculative decoding, single stream: SmolLM2-135M-Instruct Q4_1, {cpu}, {os.cpu_count()} cores,")
    print(
        f"prompt {len(prompt_ids)} tokens (copy a passage of code), {args.tokens} output tokens, greedy, "
        f"ignore_eos, medians of {args.turns} turns, decode tok/s after the first token"
        + (", exact arithmetic (f32, f32 KV cache, no dynamic quantization)" if args.exact else "")
    )
    print(f"{'variant':<15}{'engine tok/s':>14}{'x plain':>9}{'server tok/s':>14}{'x plain':>9}  same text as plain")
    summary: dict[str, float | str] = {}
    for name in VARIANTS:
        row = [f"{name:<15}"]
        same = []
        for where in ("engine", "server"):
            median = statistics.median(speeds[(where, name)])
            plain = statistics.median(speeds[(where, "plain")])
            row.append(f"{median:>14.1f}{median / plain:>9.2f}")
            same.append(texts[(where, name)] == texts[(where, "plain")] and len(texts[(where, name)]) == 1)
        print("".join(row) + f"  engine {'yes' if same[0] else 'NO'}, server {'yes' if same[1] else 'NO'}")
        summary[f"{name}: server tok/s"] = statistics.median(speeds[("server", name)])
        summary[f"{name}: server x plain"] = summary[f"{name}: server tok/s"] / statistics.median(
            speeds[("server", "plain")]
        )
        summary[f"{name}: engine x plain"] = statistics.median(speeds[("engine", name)]) / statistics.median(
            speeds[("engine", "plain")]
        )
        summary[f"{name}: same text as plain"] = "yes" if all(same) else "NO"
    samples = {f"{where}, {name}": values for (where, name), values in speeds.items()}
    return Outcome(summary, samples)
