"""Reads the metadata and tensor types of a GGUF file without loading its weights.

Only the header is parsed (a few hundred kilobytes, mostly the vocabulary), so this is
fast enough to run before the engine loads the file, to refuse files the engine's GGUF
loader cannot read with a message that says why.

Nothing the header claims is trusted. Every count and length is checked against the
bytes left in the file before anything is read (a header claiming 2^60 entries is
refused at once, not parsed through a sparse file of zeros), the header's values are
bounded in number and its arrays in nesting, and every tensor's data (its offset and
the size its type and shape give) must lie within the file: the engine's GGUF reader
maps the data unchecked, and a file shorter than its header says (a download not
finished, a file cut short) would crash the process at its first read.
"""

from __future__ import annotations

import functools
import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ovtrio.files.regular_files import open_regular


@dataclass(frozen=True)
class _Format:
    """The format's constants, from the `gguf` package (llama.cpp's own)."""

    magic: bytes
    scalars: dict[int, str]  # metadata value type -> struct format of one value
    string: int
    array: int
    tensor_types: type  # ggml's tensor types (an IntEnum)
    block_sizes: dict[int, tuple[int, int]]  # tensor type -> (values per block, bytes per block)
    alignment_key: str
    default_alignment: int


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
    return _Format(
        struct.pack("<I", gguf.GGUF_MAGIC),
        scalars,
        kind.STRING,
        kind.ARRAY,
        gguf.GGMLQuantizationType,
        {int(type_id): sizes for type_id, sizes in gguf.GGML_QUANT_SIZES.items()},
        gguf.Keys.General.ALIGNMENT,
        gguf.GGUF_DEFAULT_ALIGNMENT,
    )


# Arrays of arrays nested deeper than this are refused: real files nest none (llama.cpp's
# reader takes none), and each level is a recursion of the parser.
MAX_ARRAY_NESTING = 8
# The most values (metadata entries, strings, array items, tensors) a header may hold:
# the largest vocabularies (262,144 tokens, with their scores, types and merges) hold
# about a million. A sparse file of zeros reads as valid empty entries, as many as its
# size allows: this bounds the work such a file makes.
MAX_HEADER_VALUES = 1 << 24
# ggml's most dimensions of a tensor.
MAX_DIMENSIONS = 4
# The fewest bytes a metadata entry (a key's length, a type, a one-byte value) and a
# tensor's description (a name's length, its dimension count, type and offset) take.
_ENTRY_BYTES = 8 + 4 + 1
_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8
# The fewest bytes an array item takes, besides scalars: a string's length, an array's
# item type and count.
_STRING_BYTES = 8
_ARRAY_BYTES = 4 + 8


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
        self.values = 0  # counted against MAX_HEADER_VALUES

    def expect(self, count: int, each: int, what: str) -> None:
        """Refuse `count` items of at least `each` bytes when the rest of the file cannot
        hold them, or when they pass the header's bound on values; before any is read."""
        left = len(self.data) - self.at
        if count * each > left:
            raise GGUFFormatError(f"its header claims {count} {what}, more than the {left} bytes left in the file hold")
        self.values += count
        if self.values > MAX_HEADER_VALUES:
            raise GGUFFormatError(f"its header holds more than {MAX_HEADER_VALUES} values (no model's does)")

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


def _read_value(cursor: _Cursor, value_type: int, keep: bool, depth: int = 0) -> Any:
    fmt = _format()
    scalars, string, array = fmt.scalars, fmt.string, fmt.array
    if value_type in scalars:
        return cursor.read(scalars[value_type])
    if value_type == string:
        return cursor.string()
    if value_type == array:
        if depth >= MAX_ARRAY_NESTING:
            raise GGUFFormatError(f"its metadata nests arrays more than {MAX_ARRAY_NESTING} deep")
        item_type = cursor.read("<I")
        count = cursor.read("<Q")
        if item_type in scalars:
            cursor.expect(count, struct.calcsize(scalars[item_type]), "array items")
        elif item_type == string:
            cursor.expect(count, _STRING_BYTES, "strings")
        elif item_type == array:
            cursor.expect(count, _ARRAY_BYTES, "arrays")
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
        items = [_read_value(cursor, item_type, keep, depth + 1) for _ in range(count)]
        return items if keep else None
    raise GGUFFormatError(f"unknown metadata value type {value_type}")


def read_gguf_header(path: str | Path, keep_arrays: frozenset[str] = frozenset()) -> GGUFHeader:
    """Parse the header of the GGUF file at `path`, and check that every tensor's data
    lies within the file; GGUFFormatError says what is wrong.

    Array values (the vocabulary, merges, ...) are skipped unless named in
    `keep_arrays`; scalars and strings are kept in `metadata`.
    """
    with open_regular(path) as stream:
        if stream.read(4) != _format().magic:
            raise GGUFFormatError("not a GGUF file (bad magic number)")
        with mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _parse(_Cursor(data), keep_arrays)


@dataclass(frozen=True)
class _TensorInfo:
    name: str
    dimensions: list[int]
    type_id: int
    offset: int  # from the start of the data section


def _parse(cursor: _Cursor, keep_arrays: frozenset[str]) -> GGUFHeader:
    cursor.skip(4)  # magic
    version = cursor.read("<I")
    if version < 2:
        raise GGUFFormatError(f"GGUF version {version} is too old")
    tensor_count = cursor.read("<Q")
    kv_count = cursor.read("<Q")
    cursor.expect(kv_count, _ENTRY_BYTES, "metadata entries")
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
    cursor.expect(tensor_count, _TENSOR_INFO_BYTES, "tensors")
    tensors = []
    for _ in range(tensor_count):
        name = cursor.string()
        n_dims = cursor.read("<I")
        if n_dims > MAX_DIMENSIONS:
            raise GGUFFormatError(f"tensor '{_shown(name)}' has {n_dims} dimensions (ggml's tensors have at most 4)")
        dimensions = cursor.scalars("<Q", n_dims)
        tensors.append(_TensorInfo(name, dimensions, cursor.read("<I"), cursor.read("<Q")))
    _check_extents(tensors, cursor.at, _alignment(metadata), len(cursor.data))
    types = {tensor_type_name(tensor.type_id) for tensor in tensors}
    matrix_types = {tensor_type_name(tensor.type_id) for tensor in tensors if len(tensor.dimensions) >= 2}
    return GGUFHeader(
        version=version,
        metadata=metadata,
        tensor_types=frozenset(types),
        arrays=arrays,
        array_lengths=array_lengths,
        matrix_types=frozenset(matrix_types),
    )


def _alignment(metadata: dict[str, Any]) -> int:
    """The file's data alignment: general.alignment, or the format's default."""
    alignment = metadata.get(_format().alignment_key, _format().default_alignment)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFFormatError(f"its {_format().alignment_key} ({alignment!r}) is not a power of two")
    return alignment


def _check_extents(tensors: list[_TensorInfo], header_end: int, alignment: int, file_size: int) -> None:
    """Refuse a file whose tensors' data, as the header describes it, does not lie within
    the file: each tensor's offset aligned, its rows whole blocks of its type, and its
    end (the data section's start, its offset, and the bytes its shape takes) at most
    the file's size. A type this reader does not know has no size: the file is refused
    for the type itself (ovtrio/model/source.py names it)."""
    data_start = -(-header_end // alignment) * alignment
    block_sizes = _format().block_sizes
    for tensor in tensors:
        sizes = block_sizes.get(tensor.type_id)
        if sizes is None:
            continue
        values_per_block, block_bytes = sizes
        name = _shown(tensor.name)
        if tensor.offset % alignment:
            raise GGUFFormatError(
                f"tensor '{name}' begins at offset {tensor.offset}, not a multiple of the file's alignment {alignment}"
            )
        if tensor.dimensions and tensor.dimensions[0] % values_per_block:
            raise GGUFFormatError(
                f"tensor '{name}' has rows of {tensor.dimensions[0]} values, not whole blocks of"
                f" {values_per_block} of its type {tensor_type_name(tensor.type_id)}"
            )
        end = data_start + tensor.offset + math.prod(tensor.dimensions) // values_per_block * block_bytes
        if end > file_size:
            raise GGUFFormatError(
                f"the file is shorter than its header says: tensor '{name}' ends at byte {end}, past the file's"
                f" {file_size} bytes (a download not finished, or a file cut short?)"
            )


def _shown(name: str, longest: int = 64) -> str:
    """A tensor's name as a one-line message may show it: printable, and cut short."""
    shown = name.encode("unicode_escape").decode("ascii")
    return shown if len(shown) <= longest else shown[:longest] + "..."
