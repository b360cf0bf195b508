"""Rewriting a GGUF file whose tensor types the engine cannot read into one it can.

The new file has the same metadata (vocabulary, chat template, ...) and the same tensors
in the same order; each tensor of a type the engine lacks is written as the type
gguf_targets.py chooses, the others are copied byte for byte. It is written tensor by
tensor and, within a tensor, a few thousand rows at a time, read with plain file reads
(not a memory map, whose pages would count as the process's memory): converting the
1B-class fixture took about 300 MB of resident memory in all, and a 7B model needs no
more (docs/benchmarks.md#gguf-conversion), not a float copy of the model.

Where the file goes: into the model cache, as gguf-converted/<key>.gguf, the key made of
the file's identity (cache.model_identity), this converter's version and the preference.
It is written under a temporary name and linked into place once whole, so a conversion
killed half-way leaves no file under the final name (only a temporary one, removed by the
next conversion once its process is gone), and the next start converts afresh. The
engine's IR conversion of the new file is then cached as any GGUF file's is (cache.py),
under the new file's own identity.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ovtrio.model.cache import ModelIdentity, cache_folder, model_identity
from ovtrio.model.gguf import GGUFHeader
from ovtrio.model.gguf_targets import (
    ENGINE_TYPES,
    Preference,
    Target,
    bf16_fits_f16,
    encoder_for,
    float_values,
    target_for,
)

if TYPE_CHECKING:
    from ovtrio.model.source import ModelSource
    from ovtrio.settings.server import Settings

log = logging.getLogger("ovtrio")

# Bumped when what a conversion writes changes, so older converted files are not used.
FORMAT = 1
FOLDER = "gguf-converted"
_ROW_VALUES = 1 << 22  # weights dequantized at once (16 MiB of float32)
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
    """The tensor's bytes, a few thousand whole rows at a time, as [rows, row bytes]."""
    rows = int(np.prod(t.shape[1:], dtype=np.int64)) if len(t.shape) > 1 else 1
    row_bytes = t.size // rows
    step = max(1, _ROW_VALUES // t.shape[0])
    for first in range(0, rows, step):
        count = min(step, rows - first)
        file.seek(t.offset + first * row_bytes)
        data = file.read(count * row_bytes)
        if len(data) != count * row_bytes:
            raise ConversionError(f"tensor {t.name} ends past the end of the file")
        yield np.frombuffer(data, dtype=np.uint8).reshape(count, row_bytes)


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


_CHILD = "from ovtrio.model.gguf_convert import main; main()"


def convert_in_child(source: Path, destination: Path, preference: Preference = "exact") -> list[str]:
    """convert() in a process of its own: numpy's decoding holds the GIL in many short
    calls, which in the server's process would slow its event loop (health checks
    answered in a second instead of milliseconds while the model converts), and the
    memory it takes is returned whole when it ends."""
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, str(source), str(destination), preference],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        reason = lines[-1] if lines else f"exit status {result.returncode}"
        if reason.startswith("OSError: "):  # the destination cannot be written: the caller's fallback
            raise OSError(reason.removeprefix("OSError: "))
        raise ConversionError(reason.removeprefix(f"{ConversionError.__name__}: "))
    return list(json.loads(result.stdout))


# The converted file in the model cache.


def conversion_key(identity: ModelIdentity, preference: Preference) -> str:
    payload = json.dumps(
        {"format": FORMAT, "model": asdict(identity), "preference": preference, "gguf": metadata.version("gguf")},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def _partial_name(key: str) -> str:
    return f".{key}.{os.getpid()}.partial"


def _remove_abandoned(folder: Path) -> None:
    """Temporary files of conversions whose process has gone (killed half-way)."""
    for partial in folder.glob(".*.partial"):
        try:
            pid = int(partial.name.split(".")[2])  # ".<key>.<pid>.partial", ".<key>.<pid>.json.partial"
            os.kill(pid, 0)
        except ProcessLookupError:
            partial.unlink(missing_ok=True)
        except (ValueError, PermissionError, OSError):
            continue


@dataclass(frozen=True)
class Converted:
    path: Path  # the file the engine reads
    lines: list[str]  # what was converted, one line per type
    cached: bool  # found in the cache, not converted now
    seconds: float


def converted_in_cache(source: Path, cache_root: Path, preference: Preference) -> Converted:
    """The converted file for `source` in the cache at `cache_root`: found, or made now.
    Raises OSError when the cache cannot be written, ConversionError when the file
    cannot be converted."""
    started = time.perf_counter()
    found = cached_conversion(source, cache_root, preference)
    if found is not None:
        return found
    folder = cache_root / FOLDER
    key = conversion_key(model_identity(source), preference)
    final = folder / f"{key}.gguf"
    folder.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(folder)
    partial = folder / _partial_name(key)
    try:
        lines = convert_in_child(source, partial, preference)
        summary_file = folder / f".{key}.{os.getpid()}.json.partial"
        summary_file.write_text(json.dumps({"source": str(source), "converted": lines}), encoding="utf-8")
        os.replace(summary_file, final.with_suffix(".json"))
        try:
            # A link, not a rename: of two servers converting the same file at once, the
            # first to finish publishes, and the file another may be loading stays as it is.
            os.link(partial, final)
        except FileExistsError:
            pass
    finally:
        partial.unlink(missing_ok=True)
    return Converted(final, lines, False, time.perf_counter() - started)


def cached_conversion(source: Path, cache_root: Path, preference: Preference) -> Converted | None:
    """The converted file for `source` in the cache at `cache_root`, if there is one."""
    final = cache_root / FOLDER / f"{conversion_key(model_identity(source), preference)}.gguf"
    return Converted(final, _cached_lines(final), True, 0.0) if final.is_file() else None


def _cached_lines(final: Path) -> list[str]:
    try:
        return list(json.loads(final.with_suffix(".json").read_text(encoding="utf-8"))["converted"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


@contextmanager
def converted_for_now(source: Path, preference: Preference) -> Iterator[Converted]:
    """The converted file in a temporary folder, removed when the block ends (no cache)."""
    started = time.perf_counter()
    folder = Path(tempfile.mkdtemp(prefix="ovtrio-gguf-"))
    try:
        target = folder / source.name
        lines = convert_in_child(source, target, preference)
        yield Converted(target, lines, False, time.perf_counter() - started)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def engine_readable(source: ModelSource, settings: Settings, phases: dict[str, float]) -> Iterator[ModelSource]:
    """`source`, or (a GGUF file with tensor types the engine cannot read) the same model
    rewritten into types it reads: kept in the model cache, found there on later starts;
    without the cache, written to a temporary folder removed once the block ends.
    Blocking (seconds to minutes for a large model): the caller's thread, not the event
    loop's. Raises ModelLoadError when the file cannot be converted."""
    if source.kind != "gguf" or not source.convert_tensors:
        yield source
        return
    started = time.perf_counter()
    # A prebuilt cache (filled by `ovtrio convert` when an image was built) holds the
    # converted file under the path its IR entry was keyed by.
    prebuilt = Path(settings.prebuilt_cache_dir).expanduser() if settings.prebuilt_cache_dir else None
    found = cached_conversion(source.path, prebuilt, settings.gguf_conversion) if prebuilt else None
    if found is not None:
        phases["conversion"] = time.perf_counter() - started
        _log_conversion(source, found)
        yield dataclasses.replace(source, path=found.path, convert_tensors=False)
        return
    try:
        if settings.model_cache:
            try:
                converted = converted_in_cache(
                    source.path, cache_folder(settings.cache_dir, settings.data_dir), settings.gguf_conversion
                )
            except OSError as exc:
                log.warning("cannot keep the converted GGUF file in the model cache (%s); converting for now", exc)
            else:
                phases["conversion"] = time.perf_counter() - started
                _log_conversion(source, converted)
                yield dataclasses.replace(source, path=converted.path, convert_tensors=False)
                return
        with converted_for_now(source.path, settings.gguf_conversion) as converted:
            phases["conversion"] = time.perf_counter() - started
            _log_conversion(source, converted)
            yield dataclasses.replace(source, path=converted.path, convert_tensors=False)
    except ConversionError as exc:
        from ovtrio.model.source import ModelLoadError

        raise ModelLoadError(f"cannot load model {source.path}: {exc}") from None


def _log_conversion(source: ModelSource, converted: Converted) -> None:
    if converted.cached:
        log.info(
            "tensor types the engine cannot read in %s: converted before, from the cache (%s): %s",
            source.path,
            converted.path,
            "; ".join(converted.lines),
        )
        return
    log.info(
        "tensor types the engine cannot read in %s: converted in %.1f s into %s",
        source.path,
        converted.seconds,
        converted.path,
    )
    for line in converted.lines:
        log.info("%s", line)


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
