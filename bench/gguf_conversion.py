"""What converting a GGUF file costs at load: the 1B-class fixture in each tensor type.

For each type, bench/make_tiny_llama.py writes the fixture (TinyLlama 1.1B's shape,
random codes) in that type; then a process of its own converts it as a server's first
start does (ovtrio.model.gguf_convert.convert, without the engine) and the time it took
and its peak resident memory (the kernel's figure for that process, from wait4) are
reported with the sizes of both files. With `--decode-tokens N`, the converted file is
then loaded by the engine (LLMPipeline, which converts it to an OpenVINO model in memory)
and one stream's decode speed measured (the engine's time per output token over N
tokens); `--types Q4_0` gives the speed of the fixture's native type beside them.

    python bench/gguf_conversion.py [--types Q5_K IQ4_XS ...] [--preference exact|small] [--folder /tmp]
        [--decode-tokens 32]

Prints a Markdown table; `run(args)` returns the same figures as a dict.
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

HERE = Path(__file__).resolve().parent
TYPES = ("Q5_0", "Q5_1", "Q5_K", "Q3_K", "Q2_K", "IQ4_XS", "IQ4_NL", "IQ3_S", "IQ2_XXS", "BF16", "MXFP4")

CONVERT = """
import json, sys
from pathlib import Path
from ovtrio.model.gguf_convert import convert
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


def run(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"preference": args.preference, "types": {}}
    for type_name in args.types:
        fixture = folder / f"tiny-llama-{type_name}.gguf"
        converted = folder / f"tiny-llama-{type_name}.converted.gguf"
        try:
            if not fixture.exists():
                subprocess.run(
                    [sys.executable, str(HERE / "make_tiny_llama.py"), str(fixture), "--type", type_name], check=True
                )
            seconds, peak_mb, output = _measured(
                [sys.executable, "-c", CONVERT, str(fixture), str(converted), args.preference]
            )
            results["types"][type_name] = {
                "fixture_mb": fixture.stat().st_size / 1e6,
                "converted_mb": converted.stat().st_size / 1e6,
                "seconds": seconds,
                "peak_rss_mb": peak_mb,
                "converted": json.loads(output),
            }
            if args.decode_tokens:
                _, _, speed = _measured([sys.executable, "-c", DECODE, str(converted), str(args.decode_tokens)])
                results["types"][type_name]["decode_tok_s"] = float(speed.strip().splitlines()[-1])
        finally:
            converted.unlink(missing_ok=True)
            if not args.keep:
                fixture.unlink(missing_ok=True)
        print(type_name, json.dumps(results["types"].get(type_name)), file=sys.stderr, flush=True)
    return results


def table(results: dict[str, Any]) -> str:
    rows = [
        "| type | file MB | converted MB | conversion s | peak RSS MB | decode tok/s | converted as |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for type_name, r in results["types"].items():
        speed = f"{r['decode_tok_s']:.1f}" if "decode_tok_s" in r else ""
        rows.append(
            f"| {type_name} | {r['fixture_mb']:.0f} | {r['converted_mb']:.0f} | {r['seconds']:.1f}"
            f" | {r['peak_rss_mb']:.0f} | {speed} | {'; '.join(r['converted']) or 'nothing'} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", nargs="+", default=list(TYPES), help="tensor types to write the fixture in")
    parser.add_argument("--preference", choices=("exact", "small"), default="exact", help="gguf_conversion setting")
    parser.add_argument("--folder", default="/tmp/ovtrio-gguf-conversion", help="where the files are written")
    parser.add_argument("--keep", action="store_true", help="keep the fixtures for another run")
    parser.add_argument("--decode-tokens", type=int, default=0, help="also measure decode speed over this many tokens")
    args = parser.parse_args()
    print(table(run(args)))


if __name__ == "__main__":
    main()
