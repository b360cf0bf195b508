"""The tokenizer and detokenizer IR of a GGUF file's vocabulary.

The engine's own GGUF tokenizer reads byte-level BPE vocabularies only (`gpt2`); Gemma's,
Phi-3's and Llama 2's are sentencepiece ones (`llama`). transformers rebuilds a fast
tokenizer from a GGUF vocabulary (its gguf_tokenizer_mapping, which needs no torch): the
merges recovered from the vocabulary, Gemma's and Phi-3's own fixes, control tokens kept
whole. openvino_tokenizers converts that into the two IR models the engine loads. The
chat template and the special tokens' ids go into the tokenizer's runtime information,
where the engine reads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import openvino as ov

# The file's keys the rebuild reads, as transformers names them.
ARRAYS = frozenset(
    {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"}
)


def build_tokenizers(
    metadata: Mapping[str, Any], arrays: Mapping[str, list[Any]], chat_template: str | None
) -> tuple[ov.Model, ov.Model]:
    """The tokenizer and detokenizer of the vocabulary in `metadata` and `arrays` (the
    header's values, with ARRAYS kept)."""
    import openvino_tokenizers
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf import gguf_tokenizer_mapping as mapping

    values = {**metadata, **arrays}
    grouped = {
        group: {name: values[f"tokenizer.{key}"] for key, name in renames.items() if f"tokenizer.{key}" in values}
        for group, renames in mapping.GGUF_TOKENIZER_MAPPING.items()
    }
    vocabulary = grouped["tokenizer"]
    backend, _ = mapping.convert_gguf_tokenizer(str(metadata.get("general.architecture")), vocabulary)
    tokens = vocabulary["tokens"]

    def token(key: str) -> str | None:
        index = metadata.get(f"tokenizer.ggml.{key}")
        return tokens[index] if isinstance(index, int) and 0 <= index < len(tokens) else None

    bos, eos, pad, unk = (
        token("bos_token_id"),
        token("eos_token_id"),
        token("padding_token_id"),
        token("unknown_token_id"),
    )
    add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", vocabulary.get("tokenizer_type") == "llama"))
    if add_bos and bos is not None:
        bos_id = tokens.index(bos)
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    fast = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos, eos_token=eos, pad_token=pad, unk_token=unk)
    if chat_template:
        fast.chat_template = chat_template
    tokenizer, detokenizer = openvino_tokenizers.convert_tokenizer(fast, with_detokenizer=True)
    if chat_template:
        tokenizer.set_rt_info(chat_template, "chat_template")
    for key, name in (
        ("bos_token_id", "bos_token_id"),
        ("eos_token_id", "eos_token_id"),
        ("padding_token_id", "pad_token_id"),
    ):
        if isinstance(metadata.get(f"tokenizer.ggml.{key}"), int):
            for model in (tokenizer, detokenizer):
                model.set_rt_info(int(metadata[f"tokenizer.ggml.{key}"]), name)
    return tokenizer, detokenizer
