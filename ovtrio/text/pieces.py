"""Cut a long text into pieces that tokenize as the whole does.

OpenVINO GenAI's tokenizer (built from a GGUF file, at least) cuts its output at the
model's context length whatever `max_length` and `truncation` say, so a 100,000-token
prompt comes back as 8,192 tokens. The prompt is refused either way, but the error must
state its real length, and /tokenize must count it truly. Tokenizing the text in
pieces gives the whole count: the pre-tokenizers of byte-level BPE and SentencePiece
vocabularies start a new word at a space that follows a non-space character and
precedes one, so cutting just before such a space does not change how either side is
split (checked against whole-text tokenization of README-sized texts: equal ids).
A text with no such space is cut at `max_chars`, where a token may be split in two.
"""

from __future__ import annotations


def word_pieces(text: str, max_chars: int) -> list[str]:
    """`text` in order, in pieces of at most `max_chars` characters, each cut just before
    a single space between two words when there is one."""
    pieces: list[str] = []
    start = 0
    while len(text) - start > max_chars:
        end = start + max_chars
        cut = text.rfind(" ", start + 1, end)
        while cut > start and not _between_words(text, cut):
            cut = text.rfind(" ", start + 1, cut)
        if cut <= start:
            cut = end
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


def _between_words(text: str, space: int) -> bool:
    return not text[space - 1].isspace() and space + 1 < len(text) and not text[space + 1].isspace()
