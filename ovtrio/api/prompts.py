"""Prompt building: chat messages through the model's chat template, then token ids."""

from __future__ import annotations

from typing import Any

from ovtrio.api.errors import invalid
from ovtrio.api.protocol import ChatMessage


class PromptBuilder:
    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def encode_text(self, text: str) -> list[int]:
        """A completions prompt: tokenized with the model's special tokens (e.g. BOS)."""
        return self._encode(text, add_special_tokens=True)

    def encode_chat(self, messages: list[ChatMessage]) -> list[int]:
        """A conversation rendered by the chat template; the template adds special tokens."""
        history = [{"role": _template_role(m.role), "content": m.text()} for m in messages]
        try:
            prompt = self._tokenizer.apply_chat_template(history, add_generation_prompt=True)
        except Exception as exc:  # a template error is about the messages sent
            raise invalid(f"The chat template could not render these messages: {exc}", "messages") from None
        return self._encode(prompt, add_special_tokens=False)

    def _encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        encoded = self._tokenizer.encode(text, add_special_tokens=add_special_tokens)
        return encoded.input_ids.data[0].tolist()


def _template_role(role: str) -> str:
    # "developer" is OpenAI's newer name for "system"; chat templates know only the latter.
    return "system" if role == "developer" else role
