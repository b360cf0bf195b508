"""Reads the metadata and tensor types of a GGUF file without loading its weights.

Only the header is parsed (a few hundred kilobytes, mostly the vocabulary), so this is
fast enough to run before the engine loads the file, to refuse files the engine's GGUF
loader cannot read with a message that says why.
"""

from __future__ import annotations

import functools
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class _Format:
    """The format's constants, from the `gguf` package (llama.cpp's own)."""

    magic: bytes
    scalars: dict[int, str]  # metadata value type -> struct format of one value
    string: int
    array: int
    tensor_types: type  # ggml's tensor types (an IntEnum)


@functools.cache
def _format() -> _Format:
    # Imported on the first read, not with the module: the package brings its writer,
    # tensor name tables and numpy code along (tens of milliseconds), which importing
    # the server (or serving an OpenVINO IR folder) does not need.
    import gguf

    kind = gguf.GGUFValueType
    scalars: dict[int, str] = {
        kind.UINT8: "<B",
        kind.INT8: "<b",
        kind.UINT16: "<H",
        kind.INT16: "<h",
        kind.UINT32: "<I",
        kind.INT32: "<i",
        kind.FLOAT32: "<f",
        kind.BOOL: "<?",
        kind.UINT64: "<Q",
        kind.INT64: "<q",
        kind.FLOAT64: "<d",
    }
    return _Format(struct.pack("<I", gguf.GGUF_MAGIC), scalars, kind.STRING, kind.ARRAY, gguf.GGMLQuantizationType)


def tensor_type_name(type_id: int) -> str:
    """ggml's name for a tensor type id ("Q4_K"), or "type N" for one it does not know."""
    try:
        return _format().tensor_types(type_id).name
    except ValueError:
        return f"type {type_id}"


class GGUFFormatError(ValueError):
    """The file is not a GGUF file this reader understands."""


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict[str, Any]
    tensor_types: frozenset[str]
    arrays: dict[str, list[Any]]
    array_lengths: dict[str, int]
    # The types of tensors of two or more dimensions (matrices: the engine reads F32 only
    # in vectors).
    matrix_types: frozenset[str] = frozenset()

    @property
    def vocab_size(self) -> int | None:
        return self.array_lengths.get("tokenizer.ggml.tokens")

    @property
    def architecture(self) -> str | None:
        return self.metadata.get("general.architecture")

    @property
    def context_length(self) -> int | None:
        value = self.metadata.get(f"{self.architecture}.context_length")
        return int(value) if value is not None else None


class _Cursor:
    """Reads little-endian values from a memory map of the file, front to back.

    Parsing from memory rather than with a read() call per value makes the header (a
    typical model's vocabulary strings and merges) several times faster (see
    docs/benchmarks.md#loading-a-model).
    """

    def __init__(self, data: Any) -> None:
        self.data = data
        self.at = 0

    def read(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.at + size > len(self.data):
            raise GGUFFormatError("file ends inside its header")
        value = struct.unpack_from(fmt, self.data, self.at)[0]
        self.at += size
        return value

    def skip(self, size: int) -> None:
        if self.at + size > len(self.data):
            raise GGUFFormatError("file ends inside its header")
        self.at += size

    def string(self) -> str:
        length = self.read("<Q")
        if self.at + length > len(self.data):
            raise GGUFFormatError("file ends inside its header")
        value = bytes(self.data[self.at : self.at + length]).decode("utf-8", errors="replace")
        self.at += length
        return value

    def scalars(self, fmt: str, count: int) -> list[Any]:
        many = f"{fmt[0]}{count}{fmt[1:]}"
        size = struct.calcsize(many)
        if self.at + size > len(self.data):
            raise GGUFFormatError("file ends inside its header")
        values = list(struct.unpack_from(many, self.data, self.at))
        self.at += size
        return values

    def strings(self, count: int) -> list[str]:
        data, at, end = self.data, self.at, len(self.data)
        unpack = struct.Struct("<Q").unpack_from
        values = []
        for _ in range(count):
            if at + 8 > end:
                raise GGUFFormatError("file ends inside its header")
            length = unpack(data, at)[0]
            at += 8
            if at + length > end:
                raise GGUFFormatError("file ends inside its header")
            values.append(data[at : at + length].decode("utf-8", errors="replace"))
            at += length
        self.at = at
        return values

    def skip_strings(self, count: int) -> None:
        data, at, end = self.data, self.at, len(self.data)
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(count):
            if at + 8 > end:
                raise GGUFFormatError("file ends inside its header")
            at += 8 + unpack(data, at)[0]
        if at > end:
            raise GGUFFormatError("file ends inside its header")
        self.at = at


def _read_value(cursor: _Cursor, value_type: int, keep: bool) -> Any:
    fmt = _format()
    scalars, string, array = fmt.scalars, fmt.string, fmt.array
    if value_type in scalars:
        return cursor.read(scalars[value_type])
    if value_type == string:
        return cursor.string()
    if value_type == array:
        item_type = cursor.read("<I")
        count = cursor.read("<Q")
        if not keep and item_type in scalars:
            cursor.skip(struct.calcsize(scalars[item_type]) * count)
            return None
        if not keep and item_type == string:
            cursor.skip_strings(count)
            return None
        if item_type == string:
            return cursor.strings(count)
        if item_type in scalars:
            return cursor.scalars(scalars[item_type], count)
        items = [_read_value(cursor, item_type, keep) for _ in range(count)]
        return items if keep else None
    raise GGUFFormatError(f"unknown metadata value type {value_type}")


def read_gguf_header(path: str | Path, keep_arrays: frozenset[str] = frozenset()) -> GGUFHeader:
    """Parse the header of the GGUF file at `path`.

    Array values (the vocabulary, merges, ...) are skipped unless named in
    `keep_arrays`; scalars and strings are kept in `metadata`.
    """
    with open(path, "rb") as stream:
        if stream.read(4) != _format().magic:
            raise GGUFFormatError("not a GGUF file (bad magic number)")
        with mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _parse(_Cursor(data), keep_arrays)


def _parse(cursor: _Cursor, keep_arrays: frozenset[str]) -> GGUFHeader:
    cursor.skip(4)  # magic
    version = cursor.read("<I")
    if version < 2:
        raise GGUFFormatError(f"GGUF version {version} is too old")
    tensor_count = cursor.read("<Q")
    kv_count = cursor.read("<Q")
    metadata: dict[str, Any] = {}
    arrays: dict[str, list[Any]] = {}
    array_lengths: dict[str, int] = {}
    for _ in range(kv_count):
        key = cursor.string()
        value_type = cursor.read("<I")
        if value_type == _format().array:
            at = cursor.at
            cursor.read("<I")
            array_lengths[key] = cursor.read("<Q")
            cursor.at = at
        value = _read_value(cursor, value_type, keep=key in keep_arrays)
        if isinstance(value, list):
            arrays[key] = value
        elif value is not None:
            metadata[key] = value
    types, matrix_types = set(), set()
    for _ in range(tensor_count):
        cursor.string()  # tensor name
        n_dims = cursor.read("<I")
        cursor.skip(8 * n_dims)
        type_id = cursor.read("<I")
        cursor.read("<Q")  # data offset
        types.add(tensor_type_name(type_id))
        if n_dims >= 2:
            matrix_types.add(tensor_type_name(type_id))
    return GGUFHeader(
        version=version,
        metadata=metadata,
        tensor_types=frozenset(types),
        arrays=arrays,
        array_lengths=array_lengths,
        matrix_types=frozenset(matrix_types),
    )
