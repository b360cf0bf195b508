"""A BERT encoder as an OpenVINO model, built from safetensors weights without torch.

The embedded embedder (all-MiniLM-L6-v2) ships as a sentence-transformers folder:
`model.safetensors`, `config.json` and `tokenizer.json`, no OpenVINO IR. Exporting it
the usual way (optimum-cli) needs torch, a large install, for a graph of a dozen
operations per layer; building that graph with `openvino.opset13` from the weights
read through safetensors' numpy API is quick and needs nothing more (figures:
docs/benchmarks.md#the-embedding-model).

The model's inputs are `input_ids`, `attention_mask` and `token_type_ids` [batch,
sequence], and its output is `last_hidden_state` [batch, sequence, hidden]: what
OpenVINO GenAI's TextEmbeddingPipeline pools. With `head="classifier"` the output is
instead `logits` [batch, labels] from the pooler (dense + tanh on the first token) and
a linear classifier, what a BERT cross-encoder is and TextRerankPipeline reads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np


@dataclass(frozen=True)
class BertConfig:
    hidden_size: int
    num_layers: int
    num_heads: int
    layer_norm_eps: float
    activation: str

    @classmethod
    def from_json(cls, config: Mapping[str, Any]) -> BertConfig:
        return cls(
            hidden_size=int(config["hidden_size"]),
            num_layers=int(config["num_hidden_layers"]),
            num_heads=int(config["num_attention_heads"]),
            layer_norm_eps=float(config.get("layer_norm_eps", 1e-12)),
            activation=str(config.get("hidden_act", "gelu")),
        )


class BertWeightsError(ValueError):
    """The weights are not those of a BERT model this builder knows."""


def build_bert(
    config: BertConfig, weights: Mapping[str, np.ndarray], head: Literal["hidden", "classifier"] = "hidden"
) -> Any:
    """The ov.Model of a BERT encoder with `weights` (named as Hugging Face names them)."""
    import openvino as ov
    import openvino.opset13 as ops

    if config.activation not in ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu"):
        raise BertWeightsError(f"activation '{config.activation}' is not supported")

    def weight(name: str) -> Any:
        try:
            return ops.constant(weights[name])
        except KeyError:
            raise BertWeightsError(f"the weights have no tensor '{name}'") from None

    def linear(x: Any, prefix: str) -> Any:
        return ops.add(ops.matmul(x, weight(f"{prefix}.weight"), False, True), weight(f"{prefix}.bias"))

    def layer_norm(x: Any, prefix: str) -> Any:
        normalized = ops.mvn(
            x, ops.constant(np.array([-1], dtype=np.int64)), True, config.layer_norm_eps, "inside_sqrt"
        )
        return ops.add(ops.multiply(normalized, weight(f"{prefix}.weight")), weight(f"{prefix}.bias"))

    def activation(x: Any) -> Any:
        if config.activation == "relu":
            return ops.relu(x)
        return ops.gelu(x, "erf" if config.activation == "gelu" else "tanh")

    input_ids = ops.parameter([-1, -1], ov.Type.i64, name="input_ids")
    attention_mask = ops.parameter([-1, -1], ov.Type.i64, name="attention_mask")
    token_type_ids = ops.parameter([-1, -1], ov.Type.i64, name="token_type_ids")

    zero = ops.constant(np.array(0, dtype=np.int64))
    one = ops.constant(np.array(1, dtype=np.int64))
    sequence_length = ops.gather(ops.shape_of(input_ids), one, zero)
    positions = ops.unsqueeze(ops.range(zero, sequence_length, one, ov.Type.i64), zero)
    hidden = ops.add(
        ops.add(
            ops.gather(weight("embeddings.word_embeddings.weight"), input_ids, zero),
            ops.gather(weight("embeddings.position_embeddings.weight"), positions, zero),
        ),
        ops.gather(weight("embeddings.token_type_embeddings.weight"), token_type_ids, zero),
    )
    hidden = layer_norm(hidden, "embeddings.LayerNorm")

    # Padding positions get a large negative score before the softmax: [batch, 1, 1, seq].
    mask = ops.convert(ops.unsqueeze(attention_mask, ops.constant(np.array([1, 2], dtype=np.int64))), ov.Type.f32)
    additive_mask = ops.multiply(ops.subtract(ops.constant(np.float32(1.0)), mask), ops.constant(np.float32(-1e9)))

    heads = config.num_heads
    head_size = config.hidden_size // heads
    split_heads = ops.constant(np.array([0, 0, heads, head_size], dtype=np.int64))
    merge_heads = ops.constant(np.array([0, 0, config.hidden_size], dtype=np.int64))
    to_heads = ops.constant(np.array([0, 2, 1, 3], dtype=np.int64))
    scale = ops.constant(np.float32(1.0 / np.sqrt(head_size)))

    def per_head(x: Any) -> Any:
        return ops.transpose(ops.reshape(x, split_heads, True), to_heads)

    for index in range(config.num_layers):
        prefix = f"encoder.layer.{index}"
        query = per_head(linear(hidden, f"{prefix}.attention.self.query"))
        key = per_head(linear(hidden, f"{prefix}.attention.self.key"))
        value = per_head(linear(hidden, f"{prefix}.attention.self.value"))
        scores = ops.add(ops.multiply(ops.matmul(query, key, False, True), scale), additive_mask)
        context = ops.matmul(ops.softmax(scores, -1), value, False, False)
        context = ops.reshape(ops.transpose(context, to_heads), merge_heads, True)
        attended = linear(context, f"{prefix}.attention.output.dense")
        hidden = layer_norm(ops.add(attended, hidden), f"{prefix}.attention.output.LayerNorm")
        intermediate = activation(linear(hidden, f"{prefix}.intermediate.dense"))
        hidden = layer_norm(
            ops.add(linear(intermediate, f"{prefix}.output.dense"), hidden), f"{prefix}.output.LayerNorm"
        )

    if head == "hidden":
        output = hidden
        output_name = "last_hidden_state"
    else:
        first = ops.gather(hidden, zero, one)  # [batch, hidden]: the [CLS] position
        pooled = ops.tanh(linear(first, "pooler.dense"))
        output = linear(pooled, "classifier")
        output_name = "logits"
    result = ops.result(output)
    result.output(0).get_tensor().set_names({output_name})
    return ov.Model([result], [input_ids, attention_mask, token_type_ids], "bert")


def read_bert_config(folder: Path) -> BertConfig:
    with open(folder / "config.json", encoding="utf-8") as file:
        config = json.load(file)
    if config.get("model_type") not in (None, "bert"):
        raise BertWeightsError(f"model_type '{config.get('model_type')}' is not bert")
    return BertConfig.from_json(config)
