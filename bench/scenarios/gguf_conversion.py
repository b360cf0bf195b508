"""What converting a GGUF file costs at load: the 1B-class fixture in each tensor type.

For each type, bench/make_tiny_llama.py writes the fixture (TinyLlama 1.1B's shape,
random codes) in that type; then a process of its own converts it as a server's first
start does (ovtrio.gguf.convert.convert, without the engine) and the time it took
and its peak resident memory (the kernel's figure for that process, from wait4) are
reported with the sizes of both files. With `--decode-tokens N`, the converted file is
then loaded by the engine (LLMPipeline, which converts it to an OpenVINO model in memory)
and one stream's decode speed measured (the engine's time per output token over N
tokens); `--types Q4_0` gives the speed of the fixture's native type beside them.
`--preference small` and a list of types other than all of them are variants of their
own, so a run of a few types does not hide the full table.

    python -m bench gguf_conversion [--types Q5_K IQ4_XS ...] [--preference exact|small]
        [--folder /tmp] [--keep] [--decode-tokens 32]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.driver.results import ROOT, Figure, Outcome

MAKE_FIXTURE = ROOT / "bench" / "make_tiny_llama.py"
TYPES = ("Q5_0", "Q5_1", "Q5_K", "Q3_K", "Q2_K", "IQ4_XS", "IQ4_NL", "IQ3_S", "IQ2_XXS", "BF16", "MXFP4")

CONVERT = """
import json, sys
from pathlib import Path
from ovtrio.gguf.convert import convert
lines = convert(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
print(json.dumps(lines))
"""


DECODE = """
import sys
import openvino_genai
pipe = openvino_genai.LLMPipeline(sys.argv[1], "CPU")
config = openvino_genai.GenerationConfig()
config.max_new_tokens = int(sys.argv[2])
config.ignore_eos = True
pipe.generate("Hello", config)  # the first request compiles kernels
result = pipe.generate(["The capital of France is"], config)
print(1000 / result.perf_metrics.get_tpot().mean)
"""


def _measured(command: list[str]) -> tuple[float, float, str]:
    """Run `command`; its wall time (s), peak resident memory (MB) and standard output."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"{command[:3]} exited with {process.returncode}")
    return time.perf_counter() - started, usage.ru_maxrss / 1024, output


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--types", nargs="+", default=list(TYPES), help="tensor types to write the fixture in")
    parser.add_argument("--preference", choices=("exact", "small"), default="exact", help="gguf_conversion setting")
    parser.add_argument("--folder", type=Path, default=Path("/tmp/ovtrio-gguf-conversion"), help="where the files go")
    parser.add_argument("--keep", action="store_true", help="keep the fixtures for another run")
    parser.add_argument("--decode-tokens", type=int, default=0, help="also measure decode speed over this many tokens")


def converted(folder: Path, type_name: str, preference: str, decode_tokens: int) -> dict[str, Any]:
    """Convert the fixture of `type_name` in `folder` (written first if absent) and, with
    `decode_tokens`, measure the result's decode speed; the converted file is removed."""
    fixture = folder / f"tiny-llama-{type_name}.gguf"
    target = folder / f"tiny-llama-{type_name}.converted.gguf"
    try:
        if not fixture.exists():
            subprocess.run([sys.executable, str(MAKE_FIXTURE), str(fixture), "--type", type_name], check=True)
        seconds, peak_mb, output = _measured([sys.executable, "-c", CONVERT, str(fixture), str(target), preference])
        sample: dict[str, Any] = {
            "fixture_mb": fixture.stat().st_size / 1e6,
            "converted_mb": target.stat().st_size / 1e6,
            "seconds": seconds,
            "peak_rss_mb": peak_mb,
            "converted": json.loads(output),
        }
        if decode_tokens:
            _, _, speed = _measured([sys.executable, "-c", DECODE, str(target), str(decode_tokens)])
            sample["decode_tok_s"] = float(speed.strip().splitlines()[-1])
        return sample
    finally:
        target.unlink(missing_ok=True)


def figures(type_name: str, sample: dict[str, Any]) -> dict[str, Figure]:
    """One type's row of the docs' table, each figure named with its type and unit."""
    found: dict[str, Figure] = {
        f"{type_name}: file MB": sample["fixture_mb"],
        f"{type_name}: converted MB": sample["converted_mb"],
        f"{type_name}: conversion s": sample["seconds"],
        f"{type_name}: peak RSS MB": sample["peak_rss_mb"],
    }
    if "decode_tok_s" in sample:
        found[f"{type_name}: decode tok/s, 1 stream"] = sample["decode_tok_s"]
    found[f"{type_name}: converted as"] = "; ".join(sample["converted"]) or "nothing"
    return found


def run(args: argparse.Namespace) -> Outcome:
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    samples: dict[str, Any] = {}
    summary: dict[str, Figure] = {}
    for type_name in args.types:
        try:
            samples[type_name] = converted(folder, type_name, args.preference, args.decode_tokens)
        finally:
            if not args.keep:
                (folder / f"tiny-llama-{type_name}.gguf").unlink(missing_ok=True)
        summary |= figures(type_name, samples[type_name])
        print(type_name, json.dumps(samples[type_name], ensure_ascii=False), flush=True)
    variant = ["size preferred"] if args.preference == "small" else []
    if list(args.types) != list(TYPES):
        variant.append(" ".join(args.types))
    return Outcome(summary, {"preference": args.preference, "types": samples}, ", ".join(variant))
