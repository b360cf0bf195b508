"""A GGUF file's tensors, by name, as the graph builder takes them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ovtrio.gguf.builder.weights import KEPT_TYPES, Codes, decode


class GGUFTensors:
    """The tensors of a GGUF file (memory-mapped by the gguf package, read when asked)."""

    def __init__(self, path: Path) -> None:
        import gguf

        self._reader = gguf.GGUFReader(path, "r")
        self._tensors: dict[str, Any] = {tensor.name: tensor for tensor in self._reader.tensors}

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def shape(self, name: str) -> tuple[int, ...]:
        """numpy order: rows first."""
        return tuple(int(n) for n in reversed(self._tensors[name].shape))

    def type_name(self, name: str) -> str:
        return str(self._tensors[name].tensor_type.name)

    def matrix(self, name: str) -> Codes | np.ndarray:
        """A 2-D weight: its codes where the type keeps them (weights.py), else its values
        (f16 for the float and IQ types, f32 as stored)."""
        tensor = self._tensors[name]
        rows = self.shape(name)[0]
        type_name = self.type_name(name)
        if type_name in KEPT_TYPES:
            return decode(np.asarray(tensor.data), type_name, rows)
        values = self.values(name)
        return values if type_name == "F32" else values.astype(np.float16)

    def values(self, name: str) -> np.ndarray:
        """The tensor dequantized, float32, numpy order."""
        from gguf.quants import dequantize

        tensor = self._tensors[name]
        values = dequantize(np.asarray(tensor.data), tensor.tensor_type)
        return np.asarray(values, dtype=np.float32).reshape(self.shape(name))
