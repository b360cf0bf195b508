"""The embedded model's vocabulary, read from its GGUF file as the server reads it.

Tests that send token ids (prompts, stop_token_ids) take them from here, by the bytes
or text the server reported for a token, never from arithmetic on a particular
vocabulary's layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from ovtrio.gguf.header import read_gguf_header
from ovtrio.model.source import embedded_model_path
from ovtrio.text.vocabulary import GGUF_CONTROL_TOKEN, Vocabulary


@dataclass(frozen=True)
class EmbeddedVocabulary:
    table: Vocabulary
    eos_token_id: int
    size: int

    def eos_text(self) -> str:
        return self.table.token_bytes[self.eos_token_id].decode()

    def token_id(self, data: bytes | str) -> int:
        """The one ordinary token whose bytes are `data`."""
        data = data.encode() if isinstance(data, str) else data
        ids = [i for i, token in enumerate(self.table.token_bytes) if token == data and i not in self.table.special_ids]
        assert len(ids) == 1, f"{data!r} is {len(ids)} tokens of the vocabulary"
        return ids[0]


@cache
def embedded_vocabulary() -> EmbeddedVocabulary:
    keep = frozenset({"tokenizer.ggml.tokens", "tokenizer.ggml.token_type"})
    header = read_gguf_header(embedded_model_path(), keep_arrays=keep)
    tokens = header.arrays["tokenizer.ggml.tokens"]
    types = header.arrays["tokenizer.ggml.token_type"]
    special = {i for i, kind in enumerate(types) if kind == GGUF_CONTROL_TOKEN}
    table = Vocabulary.from_byte_level(tokens, special)
    assert table is not None, "the embedded model's vocabulary is byte-level BPE"
    return EmbeddedVocabulary(table, int(header.metadata["tokenizer.ggml.eos_token_id"]), len(tokens))
