"""The GGUF header reader (ovtrio/gguf/header.py) trusts nothing a file claims: a file
shorter than its tensors say, a tensor placed past the end or off its alignment, counts
no file could hold, arrays nested without end, each refused with a reason (a
GGUFFormatError), before the engine sees the file and without reading what is not
there. In process, on files written here; no engine."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from ovtrio.gguf.header import MAX_ARRAY_NESTING, MAX_HEADER_VALUES, GGUFFormatError, read_gguf_header
from ovtrio.model import embedded_model_path

ARRAY, UINT32, STRING = 9, 4, 8


def small_model(path: Path, rows: int = 4, cols: int = 64) -> Path:
    """A valid GGUF file of two F32 tensors (the second last in the file)."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tensor("first.weight", np.ones((rows, cols), dtype=np.float32))
    writer.add_tensor("last.weight", np.ones((rows, cols), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def header(kv_count: int, tensor_count: int = 0) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, tensor_count, kv_count)


def key(name: str) -> bytes:
    return struct.pack("<Q", len(name)) + name.encode()


def tensor_info_at(path: Path, name: str) -> int:
    """Where the description of tensor `name` begins in the file."""
    return path.read_bytes().index(key(name))


def refusal(path: Path) -> str:
    with pytest.raises(GGUFFormatError) as refused:
        read_gguf_header(path)
    message = str(refused.value)
    assert "\n" not in message  # one line, for the model's failed state
    return message


def test_a_valid_file_reads_with_its_tensor_types(tmp_path):
    parsed = read_gguf_header(small_model(tmp_path / "ok.gguf"))
    assert parsed.architecture == "llama" and parsed.tensor_types == {"F32"}
    assert read_gguf_header(embedded_model_path()).tensor_types == {"F32", "Q4_1", "Q8_0"}


@pytest.mark.parametrize("missing", [1, 200, 1024])
def test_a_file_shorter_than_its_tensors_say_is_refused(tmp_path, missing):
    """A download in progress, a copy cut short: the last tensor's data is not all there."""
    path = small_model(tmp_path / "cut.gguf")
    os.truncate(path, path.stat().st_size - missing)
    message = refusal(path)
    assert "shorter than its header says" in message and "last.weight" in message, message


def test_the_embedded_model_cut_short_is_refused(tmp_path):
    cut = tmp_path / "cut.gguf"
    with open(embedded_model_path(), "rb") as source, open(cut, "wb") as target:
        target.write(source.read(embedded_model_path().stat().st_size // 2))
    assert "shorter than its header says" in refusal(cut)


def test_a_tensor_whose_offset_is_past_the_end_is_refused(tmp_path):
    path = small_model(tmp_path / "far.gguf")
    info = tensor_info_at(path, "first.weight")
    # name, dimension count, two dimensions, type, then the offset.
    offset_at = info + len(key("first.weight")) + 4 + 2 * 8 + 4
    with open(path, "r+b") as file:
        file.seek(offset_at)
        file.write(struct.pack("<Q", 1 << 40))
    message = refusal(path)
    assert "first.weight" in message and "shorter than its header says" in message, message


def test_a_tensor_off_the_alignment_is_refused(tmp_path):
    path = small_model(tmp_path / "askew.gguf")
    info = tensor_info_at(path, "last.weight")
    offset_at = info + len(key("last.weight")) + 4 + 2 * 8 + 4
    with open(path, "r+b") as file:
        file.seek(offset_at)
        (offset,) = struct.unpack("<Q", file.read(8))
        file.seek(offset_at)
        file.write(struct.pack("<Q", offset - 4))
    assert "not a multiple of the file's alignment" in refusal(path)


def test_arrays_nested_without_end_are_refused_not_recursed(tmp_path):
    """100,000 arrays each holding one array: no RecursionError, a reason."""
    depth = 100_000
    path = tmp_path / "nested.gguf"
    path.write_bytes(header(1) + key("deep") + struct.pack("<I", ARRAY) + struct.pack("<IQ", ARRAY, 1) * depth)
    assert f"nests arrays more than {MAX_ARRAY_NESTING} deep" in refusal(path)


def test_arrays_nested_a_little_still_read(tmp_path):
    path = tmp_path / "nested.gguf"
    body = key("pairs") + struct.pack("<I", ARRAY) + struct.pack("<IQ", ARRAY, 2)
    body += (struct.pack("<IQ", UINT32, 2) + struct.pack("<II", 1, 2)) * 2
    path.write_bytes(header(1) + body)
    assert read_gguf_header(path).array_lengths == {"pairs": 2}


def sparse(path: Path, head: bytes, size: int) -> Path:
    """`head`, then zeros up to `size` bytes, taking no disk (a hole)."""
    with open(path, "wb") as file:
        file.write(head)
        file.truncate(size)
    return path


@pytest.mark.parametrize(
    "claim",
    [
        header(1 << 60),  # metadata entries
        header(0, tensor_count=1 << 60),  # tensors
        header(1) + key("strings") + struct.pack("<I", ARRAY) + struct.pack("<IQ", STRING, 1 << 60),
        header(1) + key("numbers") + struct.pack("<I", ARRAY) + struct.pack("<IQ", UINT32, 1 << 60),
        header(1) + key("arrays") + struct.pack("<I", ARRAY) + struct.pack("<IQ", ARRAY, 1 << 60),
    ],
    ids=["entries", "tensors", "strings", "numbers", "arrays"],
)
def test_counts_the_file_cannot_hold_are_refused_before_reading(tmp_path, claim):
    """A header claiming 2^60 of anything, in a sparse file of zeros (which would parse as
    that many empty entries): refused from the count and the file's size alone."""
    path = sparse(tmp_path / "bomb.gguf", claim, 64 << 20)
    assert "more than the" in refusal(path) and "bytes left in the file hold" in refusal(path)


def test_a_count_the_file_could_hold_is_bounded_all_the_same(tmp_path):
    """As many empty entries as a large sparse file holds: past the header's bound on
    values, refused before the first is read."""
    entries = MAX_HEADER_VALUES + 1
    path = sparse(tmp_path / "bomb.gguf", header(entries), 13 * entries + 64)
    assert f"more than {MAX_HEADER_VALUES} values" in refusal(path)


def test_a_name_the_file_cannot_hold_is_refused(tmp_path):
    path = tmp_path / "long-key.gguf"
    path.write_bytes(header(1) + struct.pack("<Q", 1 << 62) + b"x" * 64)
    assert "file ends inside its header" in refusal(path)
