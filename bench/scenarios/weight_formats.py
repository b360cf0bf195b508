"""Does another weight format decode one stream faster?

The converted GGUF model's weights re-quantized, run alone with plain OpenVINO, against the converted model as
ovtrio serves it; with how far each moves the model's log-probabilities.

The engine converts GGUF blocks as they are: 4-bit codes in groups of 32, each group
with an f16 scale and zero point (Q4_0, Q4_1), or 8-bit in groups of 32 (Q8_0). Here
every such matmul weight is dequantized and written again as:

- `u4-g128`: 4-bit, asymmetric, groups of 128 (a quarter of the scales to read);
- `u8-channel`: 8-bit, asymmetric, one scale and zero point per output channel;
- `f16`: plain half precision (small models only: four times the bytes of 4-bit).

    python -m bench weight_formats [--model embedded|file.gguf] [--formats ...] [--tokens 48]

Prints decode tok/s (the bare IR's infer() loop of the decode_profile scenario, medians of
interleaved repeats), the weights' bytes, and the largest log-probability change of
the converted model's likeliest token at each position of a 64-token prompt.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np
import openvino as ov
from openvino import opset13 as ops

from bench.driver.hardware import gguf_path
from bench.driver.results import Outcome
from bench.scenarios.decode_profile import PROMPT_TOKENS, Decoder, converted_folder

FORMATS = ("u4-g128", "u8-channel", "f16")


def unpack_u4(packed: np.ndarray, count: int) -> np.ndarray:
    """OpenVINO's u4 layout: two codes a byte, the first in the low nibble."""
    codes = np.empty(packed.size * 2, dtype=np.uint8)
    codes[0::2] = packed & 0x0F
    codes[1::2] = packed >> 4
    return codes[:count]


def pack_u4(codes: np.ndarray) -> np.ndarray:
    flat = codes.reshape(-1).astype(np.uint8)
    if flat.size % 2:
        flat = np.append(flat, 0)
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)


def constant_values(node: ov.Node) -> np.ndarray:
    """A Constant's values as numbers, u4 unpacked."""
    shape = list(node.get_output_shape(0))
    count = int(np.prod(shape))
    data = node.get_data()
    if node.get_output_element_type(0) == ov.Type.u4:
        return unpack_u4(data.reshape(-1), count).reshape(shape)
    return np.asarray(data).reshape(shape)


def source_value(output: ov.Output) -> np.ndarray:
    """The value an output carries, through Convert nodes, down to a Constant."""
    node = output.get_node()
    while node.get_type_name() == "Convert":
        node = node.input_value(0).get_node()
    assert node.get_type_name() == "Constant", node.get_type_name()
    return constant_values(node).astype(np.float32)


def compressed_weights(model: ov.Model) -> list[tuple[ov.Node, np.ndarray]]:
    """Each MatMul fed by a dequantization (codes -> Subtract zero point -> Multiply
    scale -> Reshape), with its weights as float32 [out, in]."""
    found = []
    for op in model.get_ops():
        if op.get_type_name() != "MatMul":
            continue
        node = op.input_value(1).get_node()
        while node.get_type_name() in ("Convert", "Reshape"):
            node = node.input_value(0).get_node()
        if node.get_type_name() != "Multiply":
            continue
        scaled, scale = node.input_value(0).get_node(), source_value(node.input_value(1))
        if scaled.get_type_name() == "Subtract":
            codes, zero = source_value(scaled.input_value(0)), source_value(scaled.input_value(1))
            weights = (codes - zero) * scale
        else:
            weights = source_value(node.input_value(0)) * scale
        out_features = weights.shape[0]
        found.append((op, weights.reshape(out_features, -1)))
    return found


def quantized(weights: np.ndarray, bits: int, group: int | None) -> ov.Output:
    """Asymmetric codes of `bits` with one scale and zero point per `group` columns
    (None: per row), dequantized in the graph to f32 [out, in]."""
    out_features, in_features = weights.shape
    grouped = weights.reshape(out_features, -1, group or in_features)
    low, high = grouped.min(axis=2, keepdims=True), grouped.max(axis=2, keepdims=True)
    levels = 2**bits - 1
    scale = np.maximum(high - low, 1e-8) / levels
    zero = np.clip(np.round(-low / scale), 0, levels)
    codes = np.clip(np.round(grouped / scale + zero), 0, levels)
    kind = ov.Type.u4 if bits == 4 else ov.Type.u8

    def constant(values: np.ndarray) -> ov.Node:
        if kind == ov.Type.u8:
            return ops.constant(values.astype(np.uint8))
        tensor = ov.Tensor(ov.Type.u4, ov.Shape(list(values.shape)))
        tensor.data[:] = pack_u4(values).reshape(tensor.data.shape)
        return ops.constant(tensor)

    dequantized = ops.multiply(
        ops.subtract(ops.convert(constant(codes), ov.Type.f16), ops.convert(constant(zero), ov.Type.f16)),
        ops.constant(scale.astype(np.float16)),
    )
    shaped = ops.reshape(dequantized, ops.constant(np.array([out_features, in_features], dtype=np.int64)), False)
    return ops.convert(shaped, ov.Type.f32).output(0)


def rewritten(source: Path, fmt: str) -> ov.Model:
    model = ov.Core().read_model(source / "openvino_model.xml")
    for matmul, weights in compressed_weights(model):
        if fmt == "f16":
            new = ops.convert(ops.constant(weights.astype(np.float16)), ov.Type.f32).output(0)
        elif fmt == "u8-channel":
            new = quantized(weights, 8, None)
        else:
            new = quantized(weights, 4, 128 if weights.shape[1] % 128 == 0 else 32)
        matmul.input(1).replace_source_output(new)
    model.validate_nodes_and_infer_types()
    return model


def weight_bytes(model: ov.Model) -> int:
    return sum(
        op.get_byte_size() for op in model.get_ops() if op.get_type_name() == "Constant" and op.get_byte_size() > 4096
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--formats", nargs="+", choices=FORMATS, default=list(FORMATS))
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)


def run(args: argparse.Namespace) -> Outcome:
    gguf = gguf_path(args.model)
    folder = converted_folder(gguf)
    source = ov.Core().read_model(folder / "openvino_model.xml")
    models = {"as converted": source} | {fmt: rewritten(folder, fmt) for fmt in args.formats}
    decoders = {name: Decoder(model) for name, model in models.items()}
    prompt = (np.arange(PROMPT_TOKENS * 4, dtype=np.int64)[None, :] * 7919 + 11) % 30000 + 100
    rates: dict[str, list[float]] = {name: [] for name in models}
    reference = np.empty(0)
    drift: dict[str, float] = {}
    for repeat in range(args.repeats):
        for name, decoder in decoders.items():
            rate, logprobs = decoder.run(prompt, args.tokens)
            rates[name].append(rate)
            if repeat == 0:
                if name == "as converted":
                    reference = logprobs
                else:
                    # At each prompt position, the converted model's likeliest next
                    # token: how far this model moves its log-probability, at most.
                    chosen = reference.argmax(axis=-1)
                    rows = np.arange(len(chosen))
                    drift[name] = float(np.abs(reference[rows, chosen] - logprobs[rows, chosen]).max())
    print(f"{gguf.name}: decode tok/s of the bare IR, {args.tokens} tokens, medians of {args.repeats} interleaved")
    base = statistics.median(rates["as converted"])
    summary: dict[str, float] = {}
    for name, model in models.items():
        rate = statistics.median(rates[name])
        change = "" if name == "as converted" else f"  max |d logprob| over the prompt {drift[name]:.3f}"
        size = weight_bytes(model) / 1e6
        print(f"  {name:<13} {rate:7.1f} tok/s  {rate / base:5.2f}x  weights {size:6.0f} MB{change}")
        summary[f"{name}: tok/s"] = rate
        summary[f"{name}: x as converted"] = rate / base
        summary[f"{name}: weights MB"] = size
        if name in drift:
            summary[f"{name}: max |d logprob|"] = drift[name]
    return Outcome(summary, rates, "" if args.model == "embedded" else gguf.name)
