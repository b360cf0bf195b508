"""The machine a result was measured on, and what bounds one stream's decode on it: the
CPU's instruction sets, the memory read bandwidth, and the bytes of weights a model reads
per generated token.

Every decoded token reads all the weights once (a 1B-class model is far bigger than the
caches), so `bandwidth / bytes per token` is the most tokens per second any server can
reach for a single stream; the peer scenario prints both servers' figures against it.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np

# The instruction sets that change which kernels OpenVINO and llama.cpp run.
ISA_FLAGS = ("avx2", "avx_vnni", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")


def cpu_field(name: str) -> str:
    """A field of /proc/cpuinfo's first processor ("model name", "cpu family")."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.split(":", 1)[0].strip() == name:
            return line.split(":", 1)[1].strip()
    return "?"


def cpu_name() -> str:
    return cpu_field("model name")


def cpu_isa() -> list[str]:
    """The vector instruction sets this CPU offers, of those that matter here."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return [flag for flag in ISA_FLAGS if flag in flags]
    return []


def machine_label() -> str:
    """What tells this machine from the others results come from: the CPU's name, its
    family and model (one name covers several generations: "AMD EPYC" is Zen 4 and Zen 5
    here) and the cores. The report keeps the latest result per scenario per label."""
    return f"{cpu_name()} (family {cpu_field('cpu family')} model {cpu_field('model')}), {os.cpu_count()} cores"


def fingerprint() -> dict[str, object]:
    """The machine as a result records it."""
    memory = next(
        (line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal:")),
        "0",
    )
    return {
        "label": machine_label(),
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "isa": cpu_isa(),
        "memory_gb": round(int(memory) / 2**20, 1),
        "kernel": os.uname().release,
    }


def describe_cpu() -> str:
    return f"{cpu_name()}, {os.cpu_count()} cores, {' '.join(cpu_isa()) or 'no AVX2'}"


def read_bandwidth_gb_s(threads: int | None = None, mib_per_thread: int = 512, repeats: int = 3) -> float:
    """Memory read bandwidth with every core reading its own array (numpy's sum releases
    the GIL and streams the array once): the best of `repeats`, in GB/s."""
    threads = threads or os.cpu_count() or 1
    arrays = [np.ones(mib_per_thread * 2**20 // 4, dtype=np.float32) for _ in range(threads)]
    best = 0.0
    for _ in range(repeats):
        barrier = threading.Barrier(threads + 1)

        def read(array: np.ndarray, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            array.sum()

        workers = [threading.Thread(target=read, args=(array,)) for array in arrays]
        for worker in workers:
            worker.start()
        barrier.wait()
        started = time.perf_counter()
        for worker in workers:
            worker.join()
        elapsed = time.perf_counter() - started
        best = max(best, sum(array.nbytes for array in arrays) / elapsed / 1e9)
    return best


def gguf_path(name: str) -> Path:
    """A benchmark's --model: a GGUF file, or 'embedded' for the embedded model's."""
    if name != "embedded":
        return Path(name)
    from ovtrio.model import embedded_model_path

    return Path(embedded_model_path())


def weight_bytes_per_token(gguf_path: Path) -> int:
    """Bytes of weights one decoded token reads: every tensor but the token embedding
    table, of which one row is read (unless the model ties it to the output layer, which
    then reads all of it)."""
    import gguf

    reader = gguf.GGUFReader(gguf_path)
    sizes = {tensor.name: int(tensor.n_bytes) for tensor in reader.tensors}
    total = sum(sizes.values())
    if "output.weight" in sizes and "token_embd.weight" in sizes:
        total -= sizes["token_embd.weight"]
    return total


def ceiling_tok_s(gguf_path: Path, bandwidth_gb_s: float) -> float:
    return bandwidth_gb_s * 1e9 / weight_bytes_per_token(gguf_path)
