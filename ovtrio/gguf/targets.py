"""Which tensor type the engine reads each GGUF tensor type as, and the blocks of it.

OpenVINO GenAI's GGUF reader (2026.4, src/cpp/src/gguf_utils) builds matrices only from
F16, Q4_0, Q4_1, Q4_K, Q6_K and Q8_0 blocks (and norms from F32 or F16); llama.cpp
writes a dozen more. Every other type is rewritten into one of these, block by block:

- where the file's blocks are an f16 scale times small integers, the integers and the
  scale are copied into a type that holds them: Q5_0, IQ4_NL and MXFP4 into Q8_0 and Q3_K
  into Q6_K are exact (gguf.quants.dequantize reads the same numbers from both), IQ4_XS
  into Q8_0 exact but for the rounding of each 32-weight scale to f16 (at most 2^-11 of
  each weight); BF16 into F16 is exact for every weight of magnitude 2^-17 to 65504;
- the others are dequantized and quantized again: into Q8_0 (8.5 bits a weight; each
  weight within 1/254 of its block's largest, far inside the file's own steps), or, when
  size is preferred, into Q6_K (6.56 bits; within 1/62 of its 16-weight group's largest)
  for types of 5 bits or more and Q4_1 (5 bits) for smaller ones;
- F32 matrices (the reader takes F32 only in vectors) become F16, each weight within
  2^-11 of itself, or Q8_0 when size is preferred.

docs/models.md has the table with what each choice costs; tests/test_gguf_conversion.py
checks each type against gguf.quants.dequantize.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

Preference = Literal["exact", "small"]

# What the engine's reader builds a matrix from (F32 only a norm or other vector).
ENGINE_TYPES = frozenset({"F32", "F16", "Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K"})

_F16_MAX = 65504.0


@dataclass(frozen=True)
class Target:
    """What one tensor becomes: the type's name, and whether the numbers are the same."""

    type_name: str
    exact: bool


def _k_rows(row_length: int) -> bool:
    return row_length % 256 == 0


# Source type -> what it becomes when exactness is preferred: the exact form where one
# exists, else Q8_0. Types not named here (the engine's own) are kept as they are.
_EXACT_TARGETS: dict[str, Target] = {
    "BF16": Target("F16", True),
    "Q5_0": Target("Q8_0", True),
    "IQ4_NL": Target("Q8_0", True),
    "MXFP4": Target("Q8_0", True),
    "Q3_K": Target("Q6_K", True),
    "IQ4_XS": Target("Q8_0", False),  # exact codes; each 32-weight scale rounded to f16
}
_FIVE_BITS_OR_MORE = frozenset({"BF16", "Q5_0", "Q5_1", "Q5_K", "Q8_1", "Q8_K"})


def target_for(type_name: str, shape: tuple[int, ...], preference: Preference = "exact") -> Target | None:
    """What a tensor of `type_name` and `shape` (ggml order: row length first) is written
    as; None when the engine reads it as it is."""
    row = int(shape[0])
    if type_name == "F32" and len(shape) >= 2:  # the reader takes F32 only in vectors
        return Target("Q8_0", False) if preference == "small" and row % 32 == 0 else Target("F16", False)
    if type_name in ENGINE_TYPES:
        return None
    if type_name == "BF16" and len(shape) == 1:
        return Target("F32", True)  # a norm: F32 holds every bf16 number
    if preference == "small":
        if type_name in _FIVE_BITS_OR_MORE:
            return Target("Q6_K", False) if _k_rows(row) else Target("Q8_0", type_name == "Q5_0")
        if type_name == "Q3_K":
            return Target("Q4_1", False)
        return Target("Q4_1", False) if row % 32 == 0 else Target("Q8_0", False)
    return _EXACT_TARGETS.get(type_name, Target("Q8_0", False))


# Block writers. Each takes float32 weights as [blocks, block length] and returns the
# target's bytes as [blocks, bytes per block]; `scales`, when given, are the file's own
# per-group scales, which make the codes the file's own integers.


def _f16(values: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return values.astype(np.float16)


def _f16_at_least(values: np.ndarray) -> np.ndarray:
    """The f16 numbers nearest `values` that are not smaller: a scale rounded down would
    push the block's largest code out of range (small scales are f16 subnormals, whose
    steps are 2^-24 whatever their size)."""
    rounded = _f16(values)
    low = rounded.astype(np.float32) < values
    return np.where(low, np.nextafter(rounded, np.float16(np.inf)), rounded)


def q8_0_blocks(weights: np.ndarray, scales: np.ndarray | None = None) -> np.ndarray:
    """Q8_0: an f16 scale and 32 signed bytes. Without `scales`, the scale is the block's
    largest magnitude / 127; a given scale that f16 cannot hold falls back to that."""
    amax = np.abs(weights).max(axis=1)
    fallback = _f16_at_least(amax / np.float32(127))
    if scales is None:
        d = fallback
    else:
        d = _f16(scales.reshape(-1))
        d_wide = d.astype(np.float32)
        bad = ~np.isfinite(d_wide) | ((d_wide == 0) & (amax > 0)) | (np.abs(d_wide) * 127.5 < amax)
        d = np.where(bad, fallback, d)
    wide = d.astype(np.float32)
    inverse = np.divide(np.float32(1), wide, out=np.zeros_like(wide), where=wide != 0)[:, None]
    scaled = np.multiply(weights, inverse, dtype=np.float32)
    np.rint(scaled, out=scaled)
    np.clip(scaled, -127, 127, out=scaled)
    out = np.empty((weights.shape[0], 34), dtype=np.uint8)
    out[:, :2] = d.reshape(-1, 1).view(np.uint8)
    out[:, 2:] = scaled.astype(np.int8).view(np.uint8)
    return out


def q6_k_blocks(
    weights: np.ndarray, super_scales: np.ndarray | None = None, group_scales: np.ndarray | None = None
) -> np.ndarray:
    """Q6_K: 256 weights in 16 groups of 16, each group's scale an int8 times the block's
    f16 scale, codes -32..31. Given `super_scales` (f16 values) and `group_scales`
    (integers -128..127, [blocks, 16]) are used as they are."""
    blocks = weights.shape[0]
    groups = weights.reshape(blocks, 16, 16)
    if super_scales is None or group_scales is None:
        ideal = np.abs(groups).max(axis=2) / np.float32(31)  # [blocks, 16]
        d = _f16_at_least(ideal.max(axis=1) / np.float32(127))
        wide = d.astype(np.float32)[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            sc = np.where(wide > 0, np.ceil(ideal / wide), 0)
        sc = np.clip(sc, 0, 127).astype(np.int8)
    else:
        d = _f16(super_scales.reshape(-1))
        sc = group_scales.astype(np.int8)
    step = d.astype(np.float32)[:, None] * sc.astype(np.float32)  # [blocks, 16], as gguf and llama.cpp compute it
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(step[:, :, None] != 0, np.rint(groups / step[:, :, None]), 0)
    codes = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(blocks, 2, 128)
    low, high = codes & 0x0F, codes >> 4
    ql = np.concatenate(
        [low[:, :, 0:32] | (low[:, :, 64:96] << 4), low[:, :, 32:64] | (low[:, :, 96:128] << 4)], axis=2
    )
    qh = high[:, :, 0:32] | (high[:, :, 32:64] << 2) | (high[:, :, 64:96] << 4) | (high[:, :, 96:128] << 6)
    return np.concatenate(
        [ql.reshape(blocks, 128), qh.reshape(blocks, 64), sc.view(np.uint8), d.reshape(-1, 1).view(np.uint8)], axis=1
    )


# The file's own scales, read from its blocks ([blocks, bytes per block], uint8).


def _f16_field(blocks: np.ndarray, at: int) -> np.ndarray:
    return blocks[:, at : at + 2].copy().view(np.float16).astype(np.float32).reshape(-1)


def _first_f16_scale(blocks: np.ndarray) -> np.ndarray:
    """Q5_0, IQ4_NL: one f16 scale at the front of each 32-weight block."""
    return _f16_field(blocks, 0)


def _mxfp4_scale(blocks: np.ndarray) -> np.ndarray:
    """MXFP4: an E8M0 exponent; the codes (e2m1 doubled) are the integers -12..12."""
    import gguf

    return np.asarray(gguf.quants.MXFP4.e8m0_to_fp32_half(blocks[:, :1]), dtype=np.float32).reshape(-1)


def _iq4_xs_scales(blocks: np.ndarray) -> np.ndarray:
    """IQ4_XS: the f16 scale times each 32-weight sub-block's 6-bit scale - 32."""
    count = blocks.shape[0]
    d = _f16_field(blocks, 0)
    words = blocks[:, 2:4].copy().view(np.uint16).reshape(count, 1)
    high = (words >> (2 * np.arange(8, dtype=np.uint16))).astype(np.uint8) & 0x03
    low = blocks[:, 4:8].reshape(count, 4, 1) >> np.array([0, 4], dtype=np.uint8)
    low = low.reshape(count, 8) & 0x0F
    sub = (low | (high << 4)).astype(np.int16) - 32
    return (d[:, None] * sub.astype(np.float32)).reshape(-1)


def _q3_k_scales(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q3_K: the f16 scale, and each 16-weight group's 6-bit scale - 32 (-32..31)."""
    count = blocks.shape[0]
    packed = blocks[:, 96:108]
    low = (packed[:, :8].reshape(count, 1, 8) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)).reshape(count, 16)
    high = (packed[:, 8:].reshape(count, 1, 4) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 4, 1)).reshape(
        count, 16
    )
    sub = ((low & 0x0F) | ((high & 0x03) << 4)).astype(np.int16) - 32
    return _f16_field(blocks, 108), sub


Encoder = Callable[[np.ndarray, np.ndarray], np.ndarray]


def encoder_for(source: str, target: str) -> Encoder:
    """A function (file's blocks [n, bytes], their weights [n * block / target block,
    target block]) -> the target's blocks."""
    if target == "Q8_0" and source in ("Q5_0", "IQ4_NL"):
        return lambda raw, weights: q8_0_blocks(weights, _first_f16_scale(raw))
    if target == "Q8_0" and source == "MXFP4":
        return lambda raw, weights: q8_0_blocks(weights, _mxfp4_scale(raw))
    if target == "Q8_0" and source == "IQ4_XS":
        return lambda raw, weights: q8_0_blocks(weights, _iq4_xs_scales(raw))
    if target == "Q8_0":
        return lambda raw, weights: q8_0_blocks(weights)
    if target == "Q6_K" and source == "Q3_K":
        return lambda raw, weights: q6_k_blocks(weights, *_q3_k_scales(raw))
    if target == "Q6_K":
        return lambda raw, weights: q6_k_blocks(weights)
    if target == "Q4_1":
        return _gguf_quantizer("Q4_1")
    raise ValueError(f"no writer for {source} -> {target}")


def _gguf_quantizer(target: str) -> Encoder:
    import gguf

    qtype = gguf.GGMLQuantizationType[target]
    return lambda raw, weights: gguf.quants.quantize(weights, qtype)


def float_values(source: str, weights: np.ndarray, target: str) -> np.ndarray:
    """F16 or F32 values of a float target (BF16's)."""
    if target == "F32":
        return weights.astype(np.float32)
    return _f16(weights)


def bf16_fits_f16(weights: np.ndarray) -> bool:
    """Whether every weight is inside f16's range (else it would become infinite)."""
    return bool(np.abs(weights).max(initial=0.0) <= _F16_MAX)
