"""A BERT forward pass in plain numpy, written from the architecture's definition, to
check what the server computes against: the embedder's vectors (mean of the last hidden
states over the real tokens, normalized) and a cross-encoder's scores (the pooler's tanh
on the first token, a linear classifier, a sigmoid)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    mean = x.mean(-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + eps) * weight + bias


def _erf(x: np.ndarray) -> np.ndarray:
    """Abramowitz and Stegun 7.1.26 (error under 1.5e-7), vectorized."""
    sign = np.sign(x)
    x = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * x)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return sign * (1.0 - poly * np.exp(-x * x))


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def hidden_states(
    weights: Mapping[str, np.ndarray],
    config: Mapping[str, object],
    ids: Sequence[int],
    token_types: Sequence[int] | None = None,
) -> np.ndarray:
    """The last hidden states [tokens, hidden] of one unpadded sequence of token ids."""
    w = {name.removeprefix("bert."): np.asarray(array, dtype=np.float64) for name, array in weights.items()}
    eps = float(config.get("layer_norm_eps", 1e-12))  # type: ignore[arg-type]
    heads = int(config["num_attention_heads"])  # type: ignore[call-overload]
    ids_array = np.asarray(ids)
    types = np.zeros_like(ids_array) if token_types is None else np.asarray(token_types)
    x = (
        w["embeddings.word_embeddings.weight"][ids_array]
        + w["embeddings.position_embeddings.weight"][np.arange(len(ids_array))]
        + w["embeddings.token_type_embeddings.weight"][types]
    )
    x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
    tokens, hidden = x.shape
    size = hidden // heads
    for layer in range(int(config["num_hidden_layers"])):  # type: ignore[call-overload]
        p = f"encoder.layer.{layer}."

        def dense(v: np.ndarray, name: str, p: str = p) -> np.ndarray:
            return v @ w[p + name + ".weight"].T + w[p + name + ".bias"]

        q = dense(x, "attention.self.query").reshape(tokens, heads, size).transpose(1, 0, 2)
        k = dense(x, "attention.self.key").reshape(tokens, heads, size).transpose(1, 0, 2)
        v = dense(x, "attention.self.value").reshape(tokens, heads, size).transpose(1, 0, 2)
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(size)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        context = (scores @ v).transpose(1, 0, 2).reshape(tokens, hidden)
        x = _layer_norm(
            dense(context, "attention.output.dense") + x,
            w[p + "attention.output.LayerNorm.weight"],
            w[p + "attention.output.LayerNorm.bias"],
            eps,
        )
        inner = _gelu(dense(x, "intermediate.dense"))
        x = _layer_norm(
            dense(inner, "output.dense") + x, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps
        )
    return x


def mean_pooled(weights: Mapping[str, np.ndarray], config: Mapping[str, object], ids: Sequence[int]) -> np.ndarray:
    """A sentence-transformers vector: mean over the tokens, then unit length."""
    vector = hidden_states(weights, config, ids).mean(0)
    return vector / np.linalg.norm(vector)


def cross_encoder_score(
    weights: Mapping[str, np.ndarray], config: Mapping[str, object], ids: Sequence[int], token_types: Sequence[int]
) -> float:
    """A one-label BERT cross-encoder's relevance: sigmoid(classifier(tanh(pooler(CLS))))."""
    w = {name.removeprefix("bert."): np.asarray(array, dtype=np.float64) for name, array in weights.items()}
    first = hidden_states(weights, config, ids, token_types)[0]
    pooled = np.tanh(first @ w["pooler.dense.weight"].T + w["pooler.dense.bias"])
    logit = float((pooled @ w["classifier.weight"].T + w["classifier.bias"])[0])
    return 1.0 / (1.0 + math.exp(-logit))
