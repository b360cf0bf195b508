"""A GGUF tensor as an OpenVINO weight: its quantized codes kept as they are in the file.

Each block-quantized type is split into integer codes and, per group of 16 or 32 weights,
a scale and a zero point, so that `scale * (code - zero_point)` is the value llama.cpp
dequantizes (`gguf.quants.dequantize`), to float32 rounding. The graph holds the codes
(u4 where they fit in four bits, u8 or i8 otherwise) and the f32 scales and zero points,
in the decompression pattern the CPU plugin fuses into its matrix products and gathers
(Convert → Subtract → Multiply → Reshape): the weights stay compressed in memory, as in
an IR that NNCF compressed, instead of a float copy.

MXFP4 (gpt-oss's experts) is kept as OpenVINO's own microscaling types: each code an
f4e2m1 (the file's 4-bit e2m1 code as it is) and each block of 32 an f8e8m0 scale (the
file's exponent byte as it is), which the CPU plugin decompresses inside its matrix product
exactly as llama.cpp does (ggml's doubled levels times half the exponent's power of two are
the same numbers).

Types with no group structure to keep (F16, BF16, the IQ and ternary types) become an f16
constant of the dequantized values; F32 stays F32 (norms and biases).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Bytes of one block and weights in it, per type whose codes are kept.
_BLOCKS = {
    "Q4_0": (18, 32),
    "Q4_1": (20, 32),
    "Q5_0": (22, 32),
    "Q5_1": (24, 32),
    "Q8_0": (34, 32),
    "Q4_K": (144, 256),
    "Q5_K": (176, 256),
    "Q6_K": (210, 256),
    "MXFP4": (17, 32),
}
KEPT_TYPES = frozenset(_BLOCKS)


@dataclass(frozen=True)
class Codes:
    """`scale * (codes - zero_point)` per group; codes [rows, groups, group], scales and zero
    points [rows, groups, 1] (zero_point None: no offset, signed codes). With `microscaled`
    the codes are e2m1 codes and the scales e8m0 exponent bytes (MXFP4), both u8."""

    codes: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray | None
    bits: int  # 4 or 8: how many bits each code needs
    microscaled: bool = False

    def values(self) -> np.ndarray:
        """The weights these codes stand for, [rows, groups * group] float32."""
        if self.microscaled:
            levels = E2M1_LEVELS[self.codes]
            powers = np.ldexp(np.float32(1.0), self.scale.astype(np.int32) - 127).astype(np.float32)
            return (levels * powers).reshape(self.codes.shape[0], -1)
        codes = self.codes.astype(np.float32)
        if self.zero_point is not None:
            codes = codes - self.zero_point
        return (codes * self.scale).reshape(self.codes.shape[0], -1)


# The value of each e2m1 code: sign in bit 3, two exponent bits and one mantissa bit.
E2M1_LEVELS = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The f16 at byte `start` of each block, as f32 [n, 1]."""
    return blocks[:, start : start + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """ggml's 4-bit layout: the low nibbles of the bytes, then the high ones."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The eight 6-bit scales and mins packed in a K-quant's 12 bytes (ggml's get_scale_min_k4)."""
    low_sc = scales[:, 0:4] & 63
    low_m = scales[:, 4:8] & 63
    high_sc = (scales[:, 8:12] & 0x0F) | ((scales[:, 0:4] >> 6) << 4)
    high_m = (scales[:, 8:12] >> 4) | ((scales[:, 4:8] >> 6) << 4)
    return np.concatenate([low_sc, high_sc], axis=1), np.concatenate([low_m, high_m], axis=1)


def _offset_to_zero_point(
    scale: np.ndarray, offset: np.ndarray, codes: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`scale * code + offset` written as `scale * (code - zero_point)`. A group whose scale is
    0 holds one value, `offset`, everywhere: it becomes code 0, scale `-offset`, zero point 1."""
    zero = scale == 0
    safe = np.where(zero, 1.0, scale)
    zero_point = np.where(zero, 1.0, -offset / safe).astype(np.float32)
    scale = np.where(zero, -offset, scale).astype(np.float32)
    if zero.any():
        codes = np.where(zero, 0, codes).astype(codes.dtype)
    return codes, scale, zero_point


def _split(raw: np.ndarray, type_name: str, rows: int) -> np.ndarray:
    size = _BLOCKS[type_name][0]
    blocks = np.ascontiguousarray(raw).view(np.uint8).reshape(-1, size)
    if blocks.shape[0] % rows:
        raise ValueError(f"{type_name} tensor of {blocks.shape[0]} blocks does not split into {rows} rows")
    return blocks


def decode(raw: np.ndarray, type_name: str, rows: int) -> Codes:
    """The codes, scales and zero points of a tensor of `rows` rows stored as `type_name`."""
    blocks = _split(raw, type_name, rows)
    n = blocks.shape[0]
    if type_name == "MXFP4":
        exponents = blocks[:, 0:1].reshape(n, 1, 1)
        if (exponents == 255).any():  # NaN in e8m0, 2**128 to llama.cpp: not a weight to keep
            raise ValueError("MXFP4 tensor with an exponent of 255")
        codes = _nibbles(blocks[:, 1:]).reshape(n, 1, 32)
        grouped = _grouped(codes, exponents, None, 4, rows)
        return Codes(grouped.codes, grouped.scale, None, 4, microscaled=True)
    if type_name == "Q8_0":
        codes = blocks[:, 2:].copy().view(np.int8).reshape(n, 1, 32)
        return _grouped(codes, _f16(blocks, 0).reshape(n, 1, 1), None, 8, rows)
    if type_name in ("Q4_0", "Q4_1"):
        head = 2 if type_name == "Q4_0" else 4
        codes = _nibbles(blocks[:, head:]).reshape(n, 1, 32)
        d = _f16(blocks, 0).reshape(n, 1, 1)
        if type_name == "Q4_0":
            return _grouped(codes, d, np.full_like(d, 8.0), 4, rows)
        codes, scale, zero_point = _offset_to_zero_point(d, _f16(blocks, 2).reshape(n, 1, 1), codes)
        return _grouped(codes, scale, zero_point, 4, rows)
    if type_name in ("Q5_0", "Q5_1"):
        head = 2 if type_name == "Q5_0" else 4
        high = blocks[:, head : head + 4].copy().view(np.uint32).reshape(n, 1)
        fifth = ((high >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
        codes = (_nibbles(blocks[:, head + 4 :]) | (fifth << 4)).reshape(n, 1, 32)
        d = _f16(blocks, 0).reshape(n, 1, 1)
        if type_name == "Q5_0":
            return _grouped(codes, d, np.full_like(d, 16.0), 8, rows)
        codes, scale, zero_point = _offset_to_zero_point(d, _f16(blocks, 2).reshape(n, 1, 1), codes)
        return _grouped(codes, scale, zero_point, 8, rows)
    if type_name in ("Q4_K", "Q5_K"):
        d, dmin = _f16(blocks, 0), _f16(blocks, 2)
        sc, m = _k_scales(blocks[:, 4:16])
        if type_name == "Q4_K":
            qs = blocks[:, 16:144].reshape(n, 4, 32)
            codes = _nibbles(qs).reshape(n, 8, 32)
            width = 4
        else:
            qh = blocks[:, 16:48].reshape(n, 1, 32)
            qs = blocks[:, 48:176].reshape(n, 4, 32)
            shifts = np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
            fifths = ((qh >> shifts) & 1).reshape(n, 8, 32)
            codes = _nibbles(qs).reshape(n, 8, 32) | (fifths << 4)
            width = 8
        scale = (d * sc).reshape(n, 8, 1).astype(np.float32)
        offset = -(dmin * m).reshape(n, 8, 1).astype(np.float32)
        codes, scale, zero_point = _offset_to_zero_point(scale, offset, codes)
        return _grouped(codes, scale, zero_point, width, rows)
    if type_name == "Q6_K":
        ql = blocks[:, 0:128].reshape(n, 2, 64)
        upper = blocks[:, 128:192].reshape(n, 2, 1, 32)
        sub_scales = blocks[:, 192:208].copy().view(np.int8).astype(np.float32)
        low = np.stack([ql[:, :, :32] & 0x0F, ql[:, :, 32:] & 0x0F, ql[:, :, :32] >> 4, ql[:, :, 32:] >> 4], axis=2)
        two_bits = (upper >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 3
        codes = (low | (two_bits << 4)).reshape(n, 16, 16)
        scale = (_f16(blocks, 208) * sub_scales).reshape(n, 16, 1).astype(np.float32)
        return _grouped(codes, scale, np.full_like(scale, 32.0), 8, rows)
    raise ValueError(f"no code layout for {type_name}")


def _grouped(codes: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None, bits: int, rows: int) -> Codes:
    """Blocks [n, g, k] regrouped per row: [rows, n/rows * g, k]."""
    groups = codes.shape[0] // rows * codes.shape[1]
    return Codes(
        codes.reshape(rows, groups, codes.shape[2]),
        scale.reshape(rows, groups, 1),
        None if zero_point is None else zero_point.reshape(rows, groups, 1),
        bits,
    )
