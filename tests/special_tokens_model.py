"""An OpenVINO IR folder of the embedded model whose tokenizer has a family's special
tokens: the embedded model's byte-level BPE vocabulary, with the texts of some of its
unused control tokens (<repo_name>, <reponame>, ...) replaced by the family's (gpt-oss's
<|start|>, <|channel|>, ...), kept at the same ids and still special. The model's
weights are the converted GGUF's in the model cache (linked, not copied); its replies
are scripted anyway (scripted_server.py). So text written in the family's format is
encoded to, and decoded from, the family's control tokens, which the server hides from
its replies unless the format's reader asks for them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ovtrio.gguf.cache import cache_folder, engine_versions, entry_key, model_identity
from ovtrio.gguf.header import read_gguf_header
from ovtrio.model.source import embedded_model_path

HARMONY_TOKENS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>")
FIRST_REPLACED = 3  # ids 0-2 are <|endoftext|>, <|im_start|>, <|im_end|>; 3-16 are unused control tokens
CONTROL_TOKENS = 17


def converted_ir() -> Path:
    """The model cache's entry of the embedded model (its IR), as the servers made it."""
    path = embedded_model_path()
    # The test session's servers keep it where OVTRIO_CACHE_DIR says (conftest.py).
    entry = cache_folder(os.environ.get("OVTRIO_CACHE_DIR"), None) / "gguf"
    entry /= entry_key(model_identity(path), engine_versions())
    assert (entry / "openvino_model.xml").is_file(), f"no converted model in {entry}: start a server first"
    return entry


def build(folder: Path, specials: tuple[str, ...], chat_template: str) -> Path:
    """Write the IR folder into `folder`, with `specials` as control tokens."""
    from openvino import save_model
    from openvino_tokenizers import convert_tokenizer
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    keep = frozenset({"tokenizer.ggml.tokens", "tokenizer.ggml.merges"})
    header = read_gguf_header(embedded_model_path(), keep_arrays=keep)
    tokens = list(header.arrays["tokenizer.ggml.tokens"])
    assert len(specials) <= CONTROL_TOKENS - FIRST_REPLACED
    tokens[FIRST_REPLACED : FIRST_REPLACED + len(specials)] = specials
    merges = [tuple(merge.split(" ", 1)) for merge in header.arrays["tokenizer.ggml.merges"]]
    bpe = Tokenizer(models.BPE(vocab={token: i for i, token in enumerate(tokens)}, merges=merges))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bpe.decoder = decoders.ByteLevel()
    bpe.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in range(CONTROL_TOKENS)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")
    tokenizer.chat_template = chat_template
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    encoder, decoder = convert_tokenizer(tokenizer, with_detokenizer=True)
    save_model(encoder, folder / "openvino_tokenizer.xml")
    save_model(decoder, folder / "openvino_detokenizer.xml")
    ir = converted_ir()
    for name in ("openvino_model.xml", "openvino_model.bin"):
        if not (folder / name).exists():
            os.symlink(ir / name, folder / name)
    (folder / "config.json").write_text(json.dumps({"max_position_embeddings": 8192, "vocab_size": len(tokens)}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 0}))
    return folder
