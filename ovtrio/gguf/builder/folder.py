"""An OpenVINO IR folder built from a GGUF file: the folder `optimum-cli export openvino`
would write for the same model, so the engine loads it as any IR folder.

It holds openvino_model.xml/.bin (the architecture's graph, builder/<architecture>.py),
openvino_tokenizer and openvino_detokenizer (tokenizer.py), config.json and
generation_config.json. A file with no chat template gets its family's own, as
llama-server falls back to it (`log` says so).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import openvino as ov

from ovtrio.gguf.builder import dense, gemma2, gemma3, gptoss, phi3, qwen2moe, qwen3moe
from ovtrio.gguf.builder.hyper import Hyper, read_hyper
from ovtrio.gguf.builder.tensors import GGUFTensors
from ovtrio.gguf.builder.tokenizer import ARRAYS, build_tokenizers
from ovtrio.gguf.header import read_gguf_header

log = logging.getLogger("ovtrio")

Builder = Callable[[Hyper, GGUFTensors], ov.Model]


@dataclass(frozen=True)
class Architecture:
    build: Builder
    family_template: str  # templates/<name>.jinja: used when the file has no chat template
    end_of_turn: tuple[str, ...] = ()  # tokens that end a reply besides the file's EOS


ARCHITECTURES: dict[str, Architecture] = {
    gemma2.ARCHITECTURE: Architecture(gemma2.build, "gemma", ("<end_of_turn>",)),
    gemma3.ARCHITECTURE: Architecture(gemma3.build, "gemma", ("<end_of_turn>",)),
    gptoss.ARCHITECTURE: Architecture(gptoss.build, "harmony", ("<|return|>", "<|call|>")),
    phi3.ARCHITECTURE: Architecture(phi3.build, "phi3", ("<|end|>",)),
    qwen2moe.ARCHITECTURE: Architecture(qwen2moe.build, "chatml", ("<|im_end|>",)),
    qwen3moe.ARCHITECTURE: Architecture(qwen3moe.build, "chatml", ("<|im_end|>",)),
    dense.SMOLLM3.architecture: Architecture(dense.builder(dense.SMOLLM3), "chatml", ("<|im_end|>",)),
    dense.GRANITE.architecture: Architecture(dense.builder(dense.GRANITE), "granite", ("<|end_of_text|>",)),
    dense.OLMO2.architecture: Architecture(dense.builder(dense.OLMO2), "olmo2", ()),
    dense.MISTRAL3.architecture: Architecture(dense.builder(dense.MISTRAL3), "mistral", ()),
}


def family_template(name: str) -> str:
    return resources.files("ovtrio.gguf.builder").joinpath("templates", f"{name}.jinja").read_text(encoding="utf-8")


def write_ir_folder(source: Path, folder: Path) -> list[str]:
    """Build the model in the GGUF file `source` into `folder` (created); return what the
    log should say of it, a line each. Raises ValueError (MissingMetadata among them) when
    the file lacks what its architecture needs."""
    header = read_gguf_header(source, keep_arrays=ARRAYS)
    architecture = ARCHITECTURES[str(header.architecture)]
    hyper = read_hyper(header.metadata)
    lines = []
    chat_template = header.metadata.get("tokenizer.chat_template")
    if not chat_template:
        chat_template = family_template(architecture.family_template)
        lines.append(f"the file has no chat template: using the {architecture.family_template} family's own")
    folder.mkdir(parents=True, exist_ok=True)
    model = architecture.build(hyper, GGUFTensors(source))
    ov.save_model(model, folder / "openvino_model.xml", compress_to_fp16=False)
    del model
    tokenizer, detokenizer = build_tokenizers(header.metadata, header.arrays, chat_template)
    ov.save_model(tokenizer, folder / "openvino_tokenizer.xml")
    ov.save_model(detokenizer, folder / "openvino_detokenizer.xml")
    config = {
        "architectures": [f"{hyper.architecture} (built from GGUF)"],
        "model_type": hyper.architecture,
        "hidden_size": hyper.hidden,
        "num_hidden_layers": hyper.layers,
        "num_attention_heads": hyper.heads,
        "num_key_value_heads": hyper.kv_heads,
        "head_dim": hyper.head_dim,
        "max_position_embeddings": hyper.context_length,
        "sliding_window": hyper.sliding_window or None,
        "vocab_size": len(header.arrays["tokenizer.ggml.tokens"]),
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    tokens = header.arrays["tokenizer.ggml.tokens"]
    generation: dict[str, object] = {}
    if isinstance(bos := header.metadata.get("tokenizer.ggml.bos_token_id"), int):
        generation["bos_token_id"] = bos
    eos = [header.metadata["tokenizer.ggml.eos_token_id"]] if "tokenizer.ggml.eos_token_id" in header.metadata else []
    eos += [tokens.index(token) for token in architecture.end_of_turn if token in tokens]
    eos = list(dict.fromkeys(eos))  # gpt-oss's <|return|> is the file's EOS and an end of turn
    if eos:
        generation["eos_token_id"] = eos if len(eos) > 1 else eos[0]
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2), encoding="utf-8")
    return lines
