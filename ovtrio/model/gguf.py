"""Reads the metadata and tensor types of a GGUF file without loading its weights.

Only the header is parsed (a few hundred kilobytes, mostly the vocabulary), so this is
fast enough to run before the engine loads the file, to refuse files the engine's GGUF
loader cannot read with a message that says why.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

GGUF_MAGIC = b"GGUF"

# GGUF metadata value types (gguf spec, "gguf_metadata_value_type").
_SCALARS = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d",
}
_STRING, _ARRAY = 8, 9

# ggml tensor type ids -> names (ggml.h, enum ggml_type).
GGML_TYPE_NAMES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
    17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS",
    24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0",
    35: "TQ2_0", 39: "MXFP4",
}


class GGUFFormatError(ValueError):
    """The file is not a GGUF file this reader understands."""


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict[str, Any]
    tensor_types: frozenset[str]
    arrays: dict[str, list[Any]]
    array_lengths: dict[str, int]

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


def _read(stream: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = stream.read(size)
    if len(data) != size:
        raise GGUFFormatError("file ends inside its header")
    return struct.unpack(fmt, data)[0]


def _read_string(stream: BinaryIO) -> str:
    length = _read(stream, "<Q")
    data = stream.read(length)
    if len(data) != length:
        raise GGUFFormatError("file ends inside its header")
    return data.decode("utf-8", errors="replace")


def _read_value(stream: BinaryIO, value_type: int, keep: bool) -> Any:
    if value_type in _SCALARS:
        return _read(stream, _SCALARS[value_type])
    if value_type == _STRING:
        return _read_string(stream)
    if value_type == _ARRAY:
        item_type = _read(stream, "<I")
        count = _read(stream, "<Q")
        if item_type in _SCALARS and not keep:
            stream.seek(struct.calcsize(_SCALARS[item_type]) * count, 1)
            return None
        items = [_read_value(stream, item_type, keep) for _ in range(count)]
        return items if keep else None
    raise GGUFFormatError(f"unknown metadata value type {value_type}")


def read_gguf_header(path: str | Path, keep_arrays: frozenset[str] = frozenset()) -> GGUFHeader:
    """Parse the header of the GGUF file at `path`.

    Array values (the vocabulary, merges, ...) are skipped unless named in
    `keep_arrays`; scalars and strings are kept in `metadata`.
    """
    with open(path, "rb") as stream:
        if stream.read(4) != GGUF_MAGIC:
            raise GGUFFormatError("not a GGUF file (bad magic number)")
        version = _read(stream, "<I")
        if version < 2:
            raise GGUFFormatError(f"GGUF version {version} is too old")
        tensor_count = _read(stream, "<Q")
        kv_count = _read(stream, "<Q")
        metadata: dict[str, Any] = {}
        arrays: dict[str, list[Any]] = {}
        array_lengths: dict[str, int] = {}
        for _ in range(kv_count):
            key = _read_string(stream)
            value_type = _read(stream, "<I")
            if value_type == _ARRAY:
                at = stream.tell()
                _read(stream, "<I")
                array_lengths[key] = _read(stream, "<Q")
                stream.seek(at)
            value = _read_value(stream, value_type, keep=key in keep_arrays)
            if isinstance(value, list):
                arrays[key] = value
            elif value is not None:
                metadata[key] = value
        types = set()
        for _ in range(tensor_count):
            _read_string(stream)  # tensor name
            n_dims = _read(stream, "<I")
            stream.seek(8 * n_dims, 1)
            type_id = _read(stream, "<I")
            _read(stream, "<Q")  # data offset
            types.add(GGML_TYPE_NAMES.get(type_id, f"type {type_id}"))
    return GGUFHeader(version=version, metadata=metadata, tensor_types=frozenset(types), arrays=arrays, array_lengths=array_lengths)
