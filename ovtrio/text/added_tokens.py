"""What a tokenizer adds around a text it encodes with its special tokens: a BOS before
it for most that add any (Gemma's, Llama's), an EOS after it for a few. A
vision-language model's engine encodes its prompt text that way (prompts.py)."""

from __future__ import annotations

from typing import Any


def added_tokens(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The ids the tokenizer adds before and after a text it encodes with its special
    tokens (a BOS before, for most that add any)."""
    probe = "a"
    try:
        added = tokenizer.encode(probe, add_special_tokens=True).input_ids.data[0].tolist()
        plain = tokenizer.encode(probe, add_special_tokens=False).input_ids.data[0].tolist()
    except (AttributeError, RuntimeError):
        return [], []
    for start in range(len(added) - len(plain) + 1):
        if added[start : start + len(plain)] == plain:
            return added[:start], added[start + len(plain) :]
    return [], []
