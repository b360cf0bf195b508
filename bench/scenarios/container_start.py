"""Container start: the image from `podman run` to /health/ready, warm and cold.

Warm: the model cache built into the image; cold: without it (the conversion into the
volume); beside `ovtrio serve` on this machine with a warm model cache, as reference.

    python -m bench container_start [--image localhost/ovtrio:0.1.0] [--runs 3]

Build the image first (scripts/build-image). Each run starts, one at a time: the image
warm, the image cold (a new empty volume), and the host's server on a cache converted
before the first run. The container runs as tests/test_container.py runs it: podman
with runc, a read-only root and one volume. Figures are medians; each run's are printed.
Needs root and podman.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from bench.driver.results import ROOT, Outcome
from bench.driver.server import free_port, ready_by_http, stop

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
PODMAN_RUN = [
    "podman",
    "--runtime",
    "runc",
    "run",
    "--detach",
    "--read-only",
    "--read-only-tmpfs=false",
    "--network=host",
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1024:1024",
]


def container_start(image: str, *flags: str) -> float:
    """Seconds from `podman run` to ready, on a new empty volume; the container removed after."""
    volume = Path(tempfile.mkdtemp(prefix="ovtrio-bench-volume-"))
    os.chown(volume, 1000, 1000)
    port = free_port()
    name = f"ovtrio-bench-{port}"
    started = time.monotonic()
    try:
        subprocess.run(
            [
                *PODMAN_RUN,
                "--name",
                name,
                "--volume",
                f"{volume}:/var/lib/ovtrio",
                *flags,
                image,
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )

        def alive() -> bool:
            state = subprocess.run(
                ["podman", "inspect", "--format", "{{.State.Running}}", name], capture_output=True, text=True
            )
            return state.stdout.strip() == "true"

        ready_by_http(port, alive)
        return time.monotonic() - started
    finally:
        subprocess.run(["podman", "rm", "--force", "--time", "0", name], capture_output=True, timeout=120)
        shutil.rmtree(volume, ignore_errors=True)


def host_start(cache: Path) -> float:
    port = free_port()
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "ovtrio", "serve", "--port", str(port), "--cache-dir", str(cache)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )
    try:
        ready_by_http(port, lambda: process.poll() is None)
        return time.monotonic() - started
    finally:
        stop(process)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--image", default=f"localhost/ovtrio:{VERSION}")
    parser.add_argument("--runs", type=int, default=3)


def run(args: argparse.Namespace) -> Outcome:
    size = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Size}}", args.image], check=True, capture_output=True, text=True
    ).stdout.strip()
    print(f"image {args.image}: {int(size) / 1e6:.0f} MB")
    cache = Path(tempfile.mkdtemp(prefix="ovtrio-bench-cache-"))
    try:
        subprocess.run(
            [sys.executable, "-m", "ovtrio", "convert", "--cache-dir", str(cache)],
            check=True,
            capture_output=True,
            cwd=ROOT,
        )
        figures: dict[str, list[float]] = {"warm": [], "cold": [], "host": []}
        for run in range(args.runs):
            figures["warm"].append(container_start(args.image))
            figures["cold"].append(container_start(args.image, "--env", "OVTRIO_PREBUILT_CACHE_DIR="))
            figures["host"].append(host_start(cache))
            print(
                f"run {run + 1}: " + ", ".join(f"{name} {values[-1]:.1f} s" for name, values in figures.items()),
                flush=True,
            )
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    warm, cold, host = (statistics.median(figures[name]) for name in ("warm", "cold", "host"))
    print(
        f"start to ready (median of {args.runs}): container warm {warm:.1f} s, container cold {cold:.1f} s,"
        f" host (warm cache) {host:.1f} s; cold/warm {cold / warm:.2f}x, warm container/host {warm / host:.2f}x"
    )
    summary = {
        "image MB": int(size) / 1e6,
        "container warm s": warm,
        "container cold s": cold,
        "host, warm cache s": host,
        "cold / warm": cold / warm,
        "warm container / host": warm / host,
    }
    return Outcome(summary, figures)
