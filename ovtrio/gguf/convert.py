"""Rewriting a GGUF file whose tensor types the engine cannot read into one it can.

The new file has the same metadata (vocabulary, chat template, ...) and the same tensors
in the same order; each tensor of a type the engine lacks is written as the type
targets.py chooses, the others are copied byte for byte. It is written tensor by
tensor and, within a tensor, a few thousand rows at a time, read with plain file reads
(not a memory map, whose pages would count as the process's memory), so the process's
memory does not grow with the model's size and never holds a float copy of the model
(docs/benchmarks.md#gguf-conversion).
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ovtrio.gguf.header import GGUFHeader
from ovtrio.gguf.targets import (
    ENGINE_TYPES,
    Preference,
    Target,
    bf16_fits_f16,
    encoder_for,
    float_values,
    target_for,
)

_PIECE_VALUES = 1 << 22  # weights dequantized at once (16 MiB of float32)
MAX_GROWTH = 6  # output bytes per input byte a conversion may write
_ALIGNMENT = 32  # at most this much padding after each tensor (GGUF's default alignment)
_SKIPPED_KEYS = ("GGUF.", "general.architecture", "general.alignment", "general.file_type")
_MOSTLY_Q8_0 = 7


class ConversionError(ValueError):
    """The file cannot be rewritten for the engine; the message says why, in one line."""


def convertible_types() -> frozenset[str]:
    """Tensor types a file may hold: the engine's, and those the gguf package decodes."""
    from gguf.quants import _type_traits  # the package's table of what it decodes (it has no public list)

    return ENGINE_TYPES | frozenset(qtype.name for qtype in _type_traits)


@dataclass(frozen=True)
class TensorPlan:
    name: str
    source: str  # the file's type name
    shape: tuple[int, ...]  # ggml order: row length first
    offset: int  # of its data in the file
    size: int  # bytes
    target: Target | None  # None: copied as it is


def plan(path: Path, preference: Preference = "exact") -> list[TensorPlan]:
    """Each tensor of the file and what it becomes."""
    import gguf

    reader = gguf.GGUFReader(path, "r")
    return _plan(reader, preference)


def _plan(reader: Any, preference: Preference) -> list[TensorPlan]:
    tensors = []
    for tensor in reader.tensors:
        shape = tuple(int(n) for n in tensor.shape)
        source = tensor.tensor_type.name
        target = target_for(source, shape, preference)
        tensors.append(TensorPlan(tensor.name, source, shape, int(tensor.data_offset), int(tensor.n_bytes), target))
    return tensors


def needs_conversion(header: GGUFHeader) -> bool:
    """Whether the file holds a tensor the engine cannot read: a type it lacks, or an F32
    matrix (its reader takes F32 only in vectors such as norms)."""
    return not header.tensor_types <= ENGINE_TYPES or "F32" in header.matrix_types


def summary(tensors: list[TensorPlan]) -> list[str]:
    """One line per converted type: "Q5_K → Q8_0: 30 tensors"."""
    counts = Counter((t.source, t.target.type_name) for t in tensors if t.target is not None)
    return [
        f"{source} → {target}: {count} tensor{'s' if count != 1 else ''}"
        for (source, target), count in sorted(counts.items())
    ]


def convert(source: Path, destination: Path, preference: Preference = "exact") -> list[str]:
    """Write `source` rewritten for the engine to `destination` (a new file); return the
    summary lines. Raises ConversionError when a type cannot be decoded."""
    import gguf

    reader = gguf.GGUFReader(source, "r")
    if "split.count" in reader.fields:
        raise ConversionError("a GGUF file split in parts cannot be converted; merge it with llama-gguf-split first")
    tensors = _plan(reader, preference)
    unknown = sorted({t.source for t in tensors} - convertible_types())
    if unknown:
        raise ConversionError(f"GGUF tensor types {', '.join(unknown)} cannot be read")
    tensors = [_checked(source, t) for t in tensors]
    _check_room(source, destination, tensors, int(reader.data_offset))
    writer = gguf.GGUFWriter(destination, str(reader.fields["general.architecture"].contents()))
    try:
        _copy_metadata(reader, writer, tensors)
        for t in tensors:
            qtype = gguf.GGMLQuantizationType[t.target.type_name if t.target else t.source]
            writer.add_tensor_info(t.name, tuple(reversed(t.shape)), np.dtype(np.float32), _bytes(t), raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        assert writer.fout is not None
        out = writer.fout[0]
        with open(source, "rb") as file:
            for t in tensors:
                writer.write_padding(out, out.tell())
                written = 0
                for chunk in _converted_chunks(file, t):
                    out.write(chunk.tobytes())
                    written += chunk.nbytes
                if written != _bytes(t):
                    raise ConversionError(f"tensor {t.name}: wrote {written} bytes, not {_bytes(t)}")
                writer.write_padding(out, written)
        out.flush()
        os.fsync(out.fileno())
    finally:
        writer.close()
    return summary(tensors)


def _check_room(source: Path, destination: Path, tensors: list[TensorPlan], header_bytes: int) -> None:
    """Refuse a conversion whose tensors would take more than MAX_GROWTH times the bytes
    of the input's, and fail (OSError, ENOSPC) one whose output does not fit where it
    goes, before writing. `header_bytes`: where the input's tensor data begins (the new
    file's header is as large)."""
    tensor_bytes = sum(_bytes(t) for t in tensors)
    given = max(1, source.stat().st_size - header_bytes)
    if tensor_bytes > MAX_GROWTH * given:
        raise ConversionError(
            f"converting it would write {tensor_bytes / 2**20:.1f} MiB of tensors from {given / 2**20:.1f} MiB,"
            f" more than {MAX_GROWTH} times as much: its header does not describe the weights in the file"
        )
    needed = header_bytes + tensor_bytes + _ALIGNMENT * len(tensors)
    free = shutil.disk_usage(destination.parent).free
    if needed > free:
        raise OSError(
            errno.ENOSPC,
            f"the converted file needs {needed / 2**20:.0f} MiB and {destination.parent} has"
            f" {free / 2**20:.0f} MiB free",
        )


def _checked(path: Path, t: TensorPlan) -> TensorPlan:
    """BF16 and F32 matrices with a weight beyond f16's range go to Q8_0 instead of F16."""
    if t.target is None or t.source not in ("BF16", "F32") or t.target.type_name != "F16":
        return t
    with open(path, "rb") as file:
        if all(bf16_fits_f16(values) for values in _weight_chunks(file, t)):
            return t
    return TensorPlan(t.name, t.source, t.shape, t.offset, t.size, Target("Q8_0", False))


def _copy_metadata(reader: Any, writer: Any, tensors: list[TensorPlan]) -> None:
    import gguf

    for name, field in reader.fields.items():
        if name.startswith(_SKIPPED_KEYS):
            continue
        main = field.types[0]
        sub = field.types[-1] if main == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), main, sub_type=sub)
    # The engine reads the quantized tensors' scales only when the file type says the file
    # is quantized (not 0, all F32, nor 1, mostly F16).
    original = reader.fields.get("general.file_type")
    file_type = int(original.contents()) if original is not None else 0
    quantized = any((t.target.type_name if t.target else t.source) not in ("F32", "F16") for t in tensors)
    if quantized and file_type in (0, 1):
        file_type = _MOSTLY_Q8_0
    writer.add_file_type(file_type)


def _sizes(type_name: str) -> tuple[int, int]:
    import gguf

    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]


def _bytes(t: TensorPlan) -> int:
    block, block_bytes = _sizes(t.target.type_name if t.target else t.source)
    return int(np.prod(t.shape, dtype=np.int64)) // block * block_bytes


def _raw_chunks(file: Any, t: TensorPlan) -> Iterator[np.ndarray]:
    """The tensor's bytes in pieces of whole blocks, as [blocks, block bytes]: at most
    _PIECE_VALUES weights each (a row longer than that is cut), each a whole number of
    the target type's blocks too."""
    block, block_bytes = _sizes(t.source)
    target_block = _sizes(t.target.type_name)[0] if t.target else block
    unit = math.lcm(block, target_block) // block  # source blocks that end on both types' blocks
    blocks = int(np.prod(t.shape, dtype=np.int64)) // block
    step = max(1, _PIECE_VALUES // (unit * block)) * unit
    for first in range(0, blocks, step):
        count = min(step, blocks - first)
        file.seek(t.offset + first * block_bytes)
        data = file.read(count * block_bytes)
        if len(data) != count * block_bytes:
            raise ConversionError(f"tensor {t.name} ends past the end of the file")
        yield np.frombuffer(data, dtype=np.uint8).reshape(count, block_bytes)


def _weight_chunks(file: Any, t: TensorPlan) -> Iterator[np.ndarray]:
    import gguf

    qtype = gguf.GGMLQuantizationType[t.source]
    for raw in _raw_chunks(file, t):
        yield gguf.quants.dequantize(raw, qtype).reshape(raw.shape[0], -1)


def _converted_chunks(file: Any, t: TensorPlan) -> Iterator[np.ndarray]:
    if t.target is None:
        yield from _raw_chunks(file, t)
        return
    target = t.target.type_name
    if target in ("F16", "F32"):
        for weights in _weight_chunks(file, t):
            yield float_values(t.source, weights, target)
        return
    import gguf

    encode = encoder_for(t.source, target)
    source_block_bytes = _sizes(t.source)[1]
    target_block = _sizes(target)[0]
    qtype = gguf.GGMLQuantizationType[t.source]
    for raw in _raw_chunks(file, t):
        weights = gguf.quants.dequantize(raw, qtype).reshape(-1, target_block)
        yield encode(raw.reshape(-1, source_block_bytes), weights)


_CHILD = "from ovtrio.gguf.convert import main; main()"


def convert_in_child(
    source: Path, destination: Path, preference: Preference = "exact", timeout: float | None = None
) -> list[str]:
    """convert() in a process of its own: numpy's decoding holds the GIL in many short
    calls, which in the server's process would slow its event loop (health checks
    answered in a second instead of milliseconds while the model converts), and the
    memory it takes is returned whole when it ends. A child still converting after
    `timeout` seconds is ended (ConversionError); what it wrote is the caller's to remove."""
    try:
        result = subprocess.run(
            [sys.executable, "-c", _CHILD, str(source), str(destination), preference],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise ConversionError(f"converting its tensors took longer than {timeout:g} s (--load-timeout)") from None
    if result.returncode != 0:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        reason = lines[-1] if lines else f"exit status {result.returncode}"
        if reason.startswith("OSError: "):  # the destination cannot be written: the caller's fallback
            raise OSError(reason.removeprefix("OSError: "))
        raise ConversionError(reason.removeprefix(f"{ConversionError.__name__}: "))
    return list(json.loads(result.stdout))


def main() -> None:
    """The child of convert_in_child (arguments: source, destination, preference):
    convert, and print the summary lines as JSON."""
    source, destination, preference = sys.argv[1:4]
    try:
        lines = convert(Path(source), Path(destination), "small" if preference == "small" else "exact")
    except ConversionError as exc:
        sys.exit(f"{ConversionError.__name__}: {exc}")
    except OSError as exc:
        sys.exit(f"OSError: {exc}")
    print(json.dumps(lines))
