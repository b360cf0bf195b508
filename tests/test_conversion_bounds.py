"""What loading a GGUF file may cost on disk, in memory and in time is bounded, and what
a failed or refused conversion wrote is gone:

- a model cache on a full disk (a 1 MiB tmpfs) or one that cannot be made (its parent is
  a file) serves the model uncached, the model given at start included;
- a rewrite of tensor types that would write more than MAX_GROWTH times its input is
  refused with the reason, one that does not fit the free space fails before writing,
  one past its time bound is ended, and a converted file the engine then refuses is
  removed: nothing of any of them is left in the cache;
- the rewrite's memory does not grow with a row's length: a row four times as long
  takes the same peak memory (measured in one test, as a ratio).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import gguf
import numpy as np
import pytest

import loopback
from conftest import running_server
from gguf_files import QuantType, tensors_file, tiny_llama
from ovtrio.gguf.convert import MAX_GROWTH, ConversionError
from ovtrio.loading.gguf_converted import FOLDER, converted_in_cache, engine_readable
from ovtrio.model.source import ModelSource
from ovtrio.settings.server import Settings


@contextmanager
def tiny_tmpfs(folder: Path) -> Iterator[Path]:
    """A 1 MiB file system at `folder` (root only: skipped elsewhere)."""
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def leftovers(cache: Path) -> list[str]:
    """Every file and folder under `cache` but the empty folders a cache makes."""
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file() or any(p.iterdir()))


def serves_uncached(tmp_path: Path, cache: Path) -> str:
    """Start a server on the embedded model with `cache` as its model cache; its log,
    once it answered a chat request."""
    with running_server(tmp_path, "--cache-dir", str(cache)) as server:
        body = {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        reply = loopback.post(server.v1 + "/chat/completions", json=body, timeout=600)
        assert reply.status_code == 200, reply.text
        return server.log_path.read_text()


def test_a_full_model_cache_serves_the_model_at_start_uncached(tmp_path):
    with tiny_tmpfs(tmp_path / "cache") as cache:
        log = serves_uncached(tmp_path, cache)
        assert "loading it uncached" in log and "converted, not cached" in log, log
        assert leftovers(cache) == []  # what the failed build wrote is gone


def test_a_model_cache_that_cannot_be_made_serves_the_model_at_start_uncached(tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    log = serves_uncached(tmp_path, tmp_path / "a-file" / "cache")
    assert "loading it uncached" in log and "converted, not cached" in log, log


# The tensor-type rewrite.


@pytest.fixture()
def q5_file(tmp_path) -> Path:
    return tensors_file(tmp_path / "q5.gguf", ["Q5_0"])


def test_a_rewrite_that_does_not_fit_the_cache_fails_before_writing(tmp_path, q5_file):
    big = tensors_file(tmp_path / "big.gguf", ["Q5_0"], rows=64, cols=32768)  # 1.4 MiB of Q5_0, 2.1 of Q8_0
    with tiny_tmpfs(tmp_path / "cache") as cache:
        with pytest.raises(OSError, match="MiB free"):
            converted_in_cache(big, cache, "exact")
        assert leftovers(cache) == []


def test_a_rewrite_past_its_time_bound_is_ended_and_leaves_nothing(tmp_path, q5_file):
    with pytest.raises(ConversionError, match="took longer than"):
        converted_in_cache(q5_file, tmp_path / "cache", "exact", timeout=0.001)
    assert leftovers(tmp_path / "cache") == []


def overlapping(path: Path, copies: int) -> Path:
    """A file whose header names `copies` Q5_0 tensors that all point at the same data:
    a small file whose rewrite would write `copies` times the tensor."""
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(path, "llama")
    for index in range(copies):
        writer.add_tensor(f"w.{index}", tiny_llama().random_blocks(rng, 64, 4096, "Q5_0"), raw_dtype=QuantType.Q5_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader = gguf.GGUFReader(path, "r+")
    for tensor in reader.tensors:
        tensor.field.parts[-1][0] = 0  # every tensor's data offset: the first one's
    data_end = reader.data_offset + reader.tensors[0].n_bytes
    del reader
    with open(path, "r+b") as file:
        file.truncate(data_end)
    return path


def test_a_rewrite_that_would_grow_the_file_past_its_bound_is_refused_and_leaves_nothing(tmp_path):
    bomb = overlapping(tmp_path / "bomb.gguf", 4 * MAX_GROWTH)
    with pytest.raises(ConversionError, match=f"more than {MAX_GROWTH} times as much"):
        converted_in_cache(bomb, tmp_path / "cache", "exact")
    assert leftovers(tmp_path / "cache") == []


def test_a_rewritten_file_the_engine_refuses_is_removed(tmp_path, q5_file):
    settings = Settings.model_validate({"cache_dir": str(tmp_path / "cache")})
    source = ModelSource(q5_file, "gguf", "q5", 2048, {}, 32000, convert_tensors=True)
    written: list[Path] = []
    with pytest.raises(RuntimeError, match="refused"):
        with engine_readable(source, settings, {}) as readable:
            written.append(readable.path)
            raise RuntimeError("refused")  # what the engine's load raises for a model it cannot build
    assert written and written[0].parent == tmp_path / "cache" / FOLDER
    assert leftovers(tmp_path / "cache") == []


# Memory.

# The child's own peak (VmHWM: ru_maxrss would carry the parent's over the exec).
_MEASURE = """
import re, sys
from pathlib import Path
from ovtrio.gguf.convert import convert
convert(Path(sys.argv[1]), Path(sys.argv[2]))
print(re.search(r"VmHWM:\\s+(\\d+) kB", Path("/proc/self/status").read_text())[1])
"""


def one_row(path: Path, length: int) -> Path:
    """A file of one Q5_0 tensor of a single row of `length` weights."""
    writer = gguf.GGUFWriter(path, "llama")
    blocks = tiny_llama().random_blocks(np.random.default_rng(0), 1, length, "Q5_0")
    writer.add_tensor("w", blocks, raw_dtype=QuantType.Q5_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def peak_kib(source: Path) -> int:
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(source), str(source.with_suffix(".out"))],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(json.loads(done.stdout.strip().splitlines()[-1]))


def test_a_rows_length_does_not_grow_the_rewrites_memory(tmp_path):
    short = peak_kib(one_row(tmp_path / "short.gguf", 8 << 20))  # 8 Mi weights in one row
    long = peak_kib(one_row(tmp_path / "long.gguf", 32 << 20))  # 32 Mi
    print(
        f"peak memory of the rewrite: {short / 1024:.0f} MiB for a row of 8 Mi weights, {long / 1024:.0f} MiB for 32 Mi"
    )
    assert long <= 1.25 * short, (short, long)
