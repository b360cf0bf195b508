"""The machine's ceiling for one stream: its CPU, read bandwidth, and each model's bytes per token.

    python -m bench hardware [model.gguf ...]

Prints the CPU's instruction sets (those that change which kernels OpenVINO and
llama.cpp run), the memory read bandwidth with every core reading, and for each GGUF
model given ('embedded': the embedded model's) the bytes of weights one decoded token
reads and the tokens a second that bandwidth allows one stream at most.
"""

from __future__ import annotations

import argparse
import os

from bench.driver.hardware import describe_cpu, gguf_path, read_bandwidth_gb_s, weight_bytes_per_token
from bench.driver.results import Outcome


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("models", nargs="*", help="GGUF files ('embedded': the embedded model's)")


def run(args: argparse.Namespace) -> Outcome:
    print(f"cpu: {describe_cpu()}")
    bandwidth = read_bandwidth_gb_s()
    print(f"read bandwidth: {bandwidth:.1f} GB/s ({os.cpu_count()} threads)")
    summary = {"read bandwidth GB/s": bandwidth}
    for model in map(gguf_path, args.models):
        per_token = weight_bytes_per_token(model)
        ceiling = bandwidth * 1e9 / per_token
        print(f"{model.name}: {per_token / 1e6:.0f} MB of weights per token -> ceiling {ceiling:.0f} tok/s")
        summary[f"{model.name}: MB per token"] = per_token / 1e6
        summary[f"{model.name}: ceiling tok/s"] = ceiling
    return Outcome(summary)
