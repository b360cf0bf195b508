"""Prompt building: chat messages through the model's chat template, completions prompts
in any of OpenAI's four forms, and the text of single tokens (for logprobs)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ovtrio.api.errors import invalid
from ovtrio.api.protocol import ChatMessage, FunctionSpec


THINK_OPEN = "<think>"


@dataclass(frozen=True)
class ChatPrompt:
    ids: list[int]
    # The template ended the prompt inside an open <think>: the reply starts as reasoning.
    opens_reasoning: bool


class PromptBuilder:
    def __init__(self, tokenizer: Any, vocab_size: int | None = None, vocabulary: Any = None) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._vocabulary = vocabulary

    def encode_completion_prompts(self, prompt: str | list[str] | list[int] | list[list[int]]) -> list[list[int]]:
        """A string, a list of strings, a list of token ids, or a list of those lists."""
        if isinstance(prompt, str):
            return [self.encode_text(prompt)]
        if all(isinstance(item, str) for item in prompt):
            return [self.encode_text(text) for text in prompt]  # type: ignore[arg-type]
        if all(isinstance(item, int) for item in prompt):
            return [self._checked_ids(prompt, "prompt")]  # type: ignore[arg-type]
        return [self._checked_ids(ids, f"prompt[{i}]") for i, ids in enumerate(prompt)]  # type: ignore[arg-type]

    def prompt_texts(self, prompt: str | list[Any], encoded: list[list[int]]) -> list[str]:
        """The text of each prompt, for echo: as sent, or decoded when sent as token ids."""
        if isinstance(prompt, str):
            return [prompt]
        if all(isinstance(item, str) for item in prompt):
            return list(prompt)
        return [self.decode(ids) for ids in encoded]

    def encode_raw(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Any text, as the tokenizer splits it (empty text gives no ids)."""
        return self._encode(text, add_special_tokens=add_special_tokens)

    def checked_ids(self, ids: list[int], param: str) -> list[int]:
        """Token ids a client sent, each checked against the vocabulary (400 naming it)."""
        return self._checked_ids(ids, param)

    def encode_text(self, text: str) -> list[int]:
        """A completions prompt: tokenized with the model's special tokens (e.g. BOS)."""
        ids = self._encode(text, add_special_tokens=True)
        if not ids:
            raise invalid("The prompt is empty.", "prompt")
        return ids

    def encode_chat(
        self,
        messages: list[ChatMessage],
        *,
        raw: bool = False,
        tools: list[FunctionSpec] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        add_generation_prompt: bool = True,
    ) -> ChatPrompt:
        """A conversation (with its tools) rendered by the chat template, which adds
        special tokens; or with `raw`, the messages' text as is (nvext.use_raw_prompt).
        `template_kwargs` are the template's own variables (e.g. enable_thinking)."""
        if raw:
            ids = self._encode("".join(m.text() for m in messages), add_special_tokens=True)
            if not ids:
                raise invalid("The messages are empty.", "messages")
            return ChatPrompt(ids, opens_reasoning=False)
        history = [_template_message(m) for m in messages]
        tool_list = [_template_tool(spec) for spec in tools or []]
        try:
            prompt = self._tokenizer.apply_chat_template(
                history, add_generation_prompt=add_generation_prompt, tools=tool_list or None, extra_context=template_kwargs or None
            )
        except Exception as exc:  # a template error is about the messages sent
            raise invalid(f"The chat template could not render these messages: {exc}", "messages") from None
        return ChatPrompt(
            self._encode(prompt, add_special_tokens=False), opens_reasoning=prompt.rstrip().endswith(THINK_OPEN)
        )

    def special_token_ids(self, texts: tuple[str, ...]) -> frozenset[int]:
        """The ids of those `texts` that are each one special token of the vocabulary."""
        if self._vocabulary is None:
            return frozenset()
        found = set()
        for text in texts:
            ids = self._encode(text, add_special_tokens=False)
            if len(ids) == 1 and ids[0] in self._vocabulary.special_ids:
                found.add(ids[0])
        return frozenset(found)

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes of one token (a partial UTF-8 character for some)."""
        if self._vocabulary is not None and token_id < len(self._vocabulary.token_bytes):
            return self._vocabulary.token_bytes[token_id]
        return self._tokenizer.decode([token_id], skip_special_tokens=False).encode()

    def output_bytes(self, skip_special_tokens: bool, keep_special_token_ids: frozenset[int] = frozenset()) -> Callable[[int], bytes]:
        """What each generated token adds to the output text, as bytes: its own bytes, or
        none for a special token that skip_special_tokens leaves out (logprob entries
        then join to exactly the text)."""
        if not skip_special_tokens:
            return self.token_bytes
        if self._vocabulary is None:  # the engine's detokenizer knows which tokens it skips
            return lambda token_id: self._tokenizer.decode([token_id], skip_special_tokens=True).encode()
        special = self._vocabulary.special_ids
        skipped = special - keep_special_token_ids

        def output_bytes(token_id: int) -> bytes:
            return b"" if token_id in skipped else self.token_bytes(token_id)

        return output_bytes

    def _checked_ids(self, ids: list[int], param: str) -> list[int]:
        if self._vocab_size is not None:
            for i, token_id in enumerate(ids):
                if token_id >= self._vocab_size:
                    raise invalid(
                        f"Invalid value for '{param}[{i}]': token id {token_id} is not in the model's"
                        f" vocabulary of {self._vocab_size} tokens.",
                        f"{param}[{i}]",
                    )
        return list(ids)

    def _encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        encoded = self._tokenizer.encode(text, add_special_tokens=add_special_tokens)
        return encoded.input_ids.data[0].tolist()


def _template_role(role: str) -> str:
    # "developer" is OpenAI's newer name for "system"; chat templates know only the latter.
    return "system" if role == "developer" else role


def _template_message(message: ChatMessage) -> dict[str, Any]:
    rendered: dict[str, Any] = {"role": _template_role(message.role), "content": message.text()}
    if message.tool_calls:
        rendered["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                # Templates index into arguments (Qwen: `tool_call.arguments | tojson`),
                # so they get the parsed object when the JSON is well formed.
                "function": {"name": call.function.name, "arguments": _maybe_json(call.function.arguments)},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id:
        rendered["tool_call_id"] = message.tool_call_id
    if message.name:
        rendered["name"] = message.name
    return rendered


def _template_tool(spec: FunctionSpec) -> dict[str, Any]:
    function: dict[str, Any] = {"name": spec.name, "parameters": spec.parameters or {"type": "object", "properties": {}}}
    if spec.description:
        function["description"] = spec.description
    return {"type": "function", "function": function}


def _maybe_json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text
