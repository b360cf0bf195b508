"""The byte string of every token, for detokenizing in Python without a tokenizer call.

OpenVINO's detokenizer is a small inference request: cheap when called in a tight
loop, but far dearer when called between engine steps, because its threads have gone
to sleep by then (see docs/benchmarks.md#tokenizing-and-detokenizing). Called once per
step, that was the largest piece of the server's own work. Byte-level BPE
vocabularies (GPT-2, Llama 3, Qwen, SmolLM) map each token to a fixed byte string, so
the text of new tokens is just their bytes run through an incremental UTF-8 decoder.

The table is read from the GGUF header or a Hugging Face tokenizer.json, and checked
against the engine's own detokenizer at load; a vocabulary that is not byte-level, or
disagrees, is not used and the engine's detokenizer serves instead.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("ovtrio")

GGUF_CONTROL_TOKEN = 3


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's printable stand-ins for the 256 byte values, reversed (char -> byte)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


_ALPHABET = _byte_level_alphabet()
# str.translate table: each stand-in to the character of its byte value (so that
# encoding to latin-1 gives the bytes), every other character below 256 to one that
# latin-1 cannot encode (characters from 256 up already fail to encode).
_TO_LATIN1 = {ord(c): chr(b) for c, b in _ALPHABET.items()}
_TO_LATIN1.update({code: "\uffff" for code in range(256) if chr(code) not in _ALPHABET})


@dataclass(frozen=True)
class Vocabulary:
    token_bytes: list[bytes]
    special_ids: frozenset[int]
    # Each token as the vocabulary spells it (byte-level stand-ins: "Ġthe" for " the").
    pieces: tuple[str, ...] = ()

    @classmethod
    def from_byte_level(cls, tokens: list[str], special_ids: set[int]) -> Vocabulary | None:
        table = []
        for token_id, token in enumerate(tokens):
            try:
                table.append(token.translate(_TO_LATIN1).encode("latin-1"))
            except UnicodeEncodeError:
                if token_id not in special_ids:
                    return None  # not a byte-level vocabulary
                table.append(token.encode())
        return cls(table, frozenset(special_ids), tuple(tokens))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Whole-sequence decode (for checking against the engine's detokenizer)."""
        data = b"".join(self.token_bytes[i] for i in ids if not (skip_special_tokens and i in self.special_ids))
        return data.decode("utf-8", errors="replace")


def _from_gguf(path: Path) -> Vocabulary | None:
    from ovtrio.gguf.header import read_gguf_header

    header = read_gguf_header(path, keep_arrays=frozenset({"tokenizer.ggml.tokens", "tokenizer.ggml.token_type"}))
    if header.metadata.get("tokenizer.ggml.model") != "gpt2":
        return None
    tokens = header.arrays.get("tokenizer.ggml.tokens")
    types = header.arrays.get("tokenizer.ggml.token_type") or []
    if not tokens:
        return None
    special = {i for i, kind in enumerate(types) if kind == GGUF_CONTROL_TOKEN}
    return Vocabulary.from_byte_level(tokens, special)


def _from_tokenizer_json(path: Path) -> Vocabulary | None:
    try:
        with open(path / "tokenizer.json", encoding="utf-8") as file:
            spec = json.load(file)
    except (OSError, ValueError):
        return None
    decoder = spec.get("decoder") or {}
    if decoder.get("type") != "ByteLevel" or (spec.get("model") or {}).get("type") != "BPE":
        return None
    vocab: dict[str, int] = dict(spec["model"].get("vocab") or {})
    special: set[int] = set()
    for added in spec.get("added_tokens") or []:
        vocab[added["content"]] = added["id"]
        if added.get("special"):
            special.add(added["id"])
    size = max(vocab.values(), default=-1) + 1
    tokens = [""] * size
    for text, token_id in vocab.items():
        tokens[token_id] = text
    return Vocabulary.from_byte_level(tokens, special)


SAMPLES = [
    "Hello, world! The capital of France is Paris.\n\n  Indented line\ttab",
    "Ünïcödé: café, naïve, 東京, Привет, 🙂🚀, ∑∞≠",
    "def f(x):\n    return {'a': [1, 2.5, -3e10]}  # code",
]


def read_vocabulary(model_path: Path, kind: str) -> Vocabulary | None:
    """The model's byte table if it has one, read from its files alone (no tokenizer:
    the load reads it while the engine compiles), not yet checked."""
    try:
        return _from_gguf(model_path) if kind == "gguf" else _from_tokenizer_json(model_path)
    except Exception:  # an unreadable vocabulary only means the slower path
        log.debug("no byte-level vocabulary", exc_info=True)
        return None


def checked_vocabulary(vocabulary: Vocabulary | None, tokenizer: Any) -> Vocabulary | None:
    """`vocabulary` if it decodes exactly as the engine's detokenizer does, else None."""
    if vocabulary is None:
        return None
    for sample in SAMPLES:
        ids = tokenizer.encode(sample, add_special_tokens=True).input_ids.data[0].tolist()
        for skip in (True, False):
            if any(i >= len(vocabulary.token_bytes) for i in ids):
                return None
            if vocabulary.decode(ids, skip) != tokenizer.decode(ids, skip_special_tokens=skip):
                log.info("byte-level vocabulary disagrees with the model's detokenizer; not using it")
                return None
    return vocabulary


def load_vocabulary(model_path: Path, kind: str, tokenizer: Any) -> Vocabulary | None:
    """The model's byte table if it has one and it decodes exactly as the engine does."""
    return checked_vocabulary(read_vocabulary(model_path, kind), tokenizer)
