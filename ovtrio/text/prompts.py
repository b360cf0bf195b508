"""Where a request becomes token ids: a conversation through the model's chat template,
completions prompts in any of OpenAI's four forms; and the text of single tokens (for
logprobs). The only place outside the engine that uses its tokenizer.

The conversation comes as the plain dicts a chat template reads (the API layer lays
its request models out that way), so this module knows nothing of HTTP.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ovtrio.engine.errors import client_reason
from ovtrio.errors import FieldError
from ovtrio.parsing import THINK_OPEN
from ovtrio.text.added_tokens import added_tokens
from ovtrio.text.pieces import word_pieces
from ovtrio.text.plain_text import PlainText
from ovtrio.text.template_text import TemplateRender, render_with_text
from ovtrio.text.vocabulary import Vocabulary

# Texts up to this long are tokenized in one call, a pause of the event loop short
# enough to take (docs/benchmarks.md#tokenizing-and-detokenizing); longer ones in
# pieces (ovtrio.text.pieces). Such a text fits a context of 8,192 tokens only at over
# 8 characters a token.
WHOLE_TEXT_CHARS = 64 * 1024


class PromptError(FieldError):
    """The prompt cannot be made from what the client sent; `param` names the field."""


@dataclass(frozen=True)
class ChatPrompt:
    ids: list[int]
    # The template ended the prompt inside an open <think>: the reply starts as reasoning.
    opens_reasoning: bool
    # For a vision-language model, whose engine takes text: the rendered prompt, with
    # an image tag where each image goes, and each image's (URL, request field).
    text: str | None = None
    images: tuple[tuple[str, str], ...] = ()


# The engine's universal image tag (ovtrio/model/vision.py).
_IMAGE_TAG = re.compile(r"<ov_genai_image_\d+>")


class PromptBuilder:
    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int | None = None,
        vocabulary: Vocabulary | None = None,
        cut_at: int | None = None,
        plain_text: PlainText | None = None,
        parse_special_in_content: bool = False,
    ) -> None:
        """`cut_at`: the length at which the tokenizer may cut its output (the model's
        context length); a text that comes back that long is counted again in pieces.
        `plain_text`: how message text is kept text (plain_text.py); without it, the
        tokenizer reads special-token text in messages as it does in a raw prompt.
        `parse_special_in_content`: the default of every `parse_special` below (the
        server's setting)."""
        self._tokenizer = tokenizer
        self._parse_special = parse_special_in_content
        self._plain_text = plain_text or PlainText(None)
        tokens = _tokenizer_vocabulary(tokenizer)
        # Without the model's own size (a config.json that omits it), the tokenizer's:
        # every id a client sends is checked, since the engine indexes its tables with it.
        self._vocab_size = vocab_size if vocab_size is not None else _vocab_size(tokens)
        # The ids the tokenizer has text for (a model's own size may be larger: an
        # output layer padded past the vocabulary).
        self.tokenizer_vocab_size = _vocab_size(tokens)
        self._vocabulary = vocabulary
        self._cut_at = cut_at
        self.longest_token_chars = _longest_token_chars(tokens)
        self._added_before, self._added_after = added_tokens(tokenizer)

    def encode_completion_prompts(self, prompt: str | list[str] | list[int] | list[list[int]]) -> list[list[int]]:
        """A string, a list of strings, a list of token ids, or a list of those lists."""
        if isinstance(prompt, str):
            return [self.encode_text(prompt)]
        if all(isinstance(item, str) for item in prompt):
            return [self.encode_text(text) for text in prompt]  # type: ignore[arg-type]
        if all(isinstance(item, int) for item in prompt):
            return [self.checked_ids(prompt, "prompt")]  # type: ignore[arg-type]
        return [self.checked_ids(ids, f"prompt[{i}]") for i, ids in enumerate(prompt)]  # type: ignore[arg-type]

    def prompt_texts(self, prompt: str | list[Any], encoded: list[list[int]]) -> list[str]:
        """The text of each prompt, for echo: as sent, or decoded when sent as token ids."""
        if isinstance(prompt, str):
            return [prompt]
        if all(isinstance(item, str) for item in prompt):
            return list(prompt)
        return [self.decode(ids) for ids in encoded]

    def prompt_pieces(self, ids: list[int], text: str) -> list[bytes]:
        """The bytes each prompt token adds to `text`, the prompt as echoed, so that they
        join to exactly it: a token's own bytes, or none for a special token the text
        does not spell at that point (one the tokenizer added, such as BOS)."""
        data = text.encode()
        at = 0
        pieces = []
        for token_id in ids:
            piece = self.token_bytes(token_id)
            if data.startswith(piece, at):
                at += len(piece)
            elif self._is_special(token_id):
                piece = b""
            pieces.append(piece)
        return pieces

    def token_piece(self, token_id: int) -> str | None:
        """The token as the vocabulary spells it (vLLM's token strings); None when the
        vocabulary is not known."""
        if self._vocabulary is None or token_id >= len(self._vocabulary.pieces):
            return None
        return self._vocabulary.pieces[token_id]

    def _is_special(self, token_id: int) -> bool:
        if self._vocabulary is not None:
            return token_id in self._vocabulary.special_ids
        return not self._tokenizer.decode([token_id], skip_special_tokens=True)

    def encode_raw(self, text: str, *, add_special_tokens: bool = True, parse_special: bool = True) -> list[int]:
        """Any text, as the tokenizer splits it (empty text gives no ids); without
        `parse_special`, special-token text in it as text."""
        if parse_special or not self._plain_text.holds_special(text):
            return self._encode(text, add_special_tokens=add_special_tokens)
        if self._plain_text.tokenizer is None:
            return self._encode(self._plain_text.neutralised(text), add_special_tokens=add_special_tokens)
        return self._encode(text, add_special_tokens=add_special_tokens, tokenizer=self._plain_text.tokenizer)

    def encode_text(self, text: str) -> list[int]:
        """A completions prompt: tokenized with the model's special tokens (e.g. BOS)."""
        ids = self._encode(text, add_special_tokens=True)
        if not ids:
            raise PromptError("The prompt is empty.", "prompt")
        return ids

    def encode_content(self, text: str, *, parse_special: bool | None = None) -> list[int]:
        """Text a client wrote in a message, continuing a prompt (an assistant prefill):
        special-token text in it tokenized as text unless `parse_special`."""
        return self.encode_raw(text, add_special_tokens=False, parse_special=self._parses_special(parse_special))

    def engine_text(self, text: str, *, parse_special: bool | None = None) -> str:
        """Text a client wrote, as a vision-language model's engine is to read it (it
        tokenizes the prompt itself): image tags always broken, special-token text
        unless `parse_special` (plain_text.py)."""
        return self._plain_text.neutralised(text, specials=not self._parses_special(parse_special), image_tags=True)

    def _parses_special(self, parse_special: bool | None) -> bool:
        """A request's parse_special, or the server's setting when it sets none."""
        return self._parse_special if parse_special is None else parse_special

    def encode_raw_chat(self, text: str) -> ChatPrompt:
        """A conversation's text as is, without the chat template (nvext.use_raw_prompt)."""
        ids = self._encode(text, add_special_tokens=True)
        if not ids:
            raise PromptError("The messages are empty.", "messages")
        return ChatPrompt(ids, opens_reasoning=False)

    def encode_chat(
        self,
        history: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        add_generation_prompt: bool = True,
        tokens_per_image: int | None = None,
        parse_special: bool | None = None,
    ) -> ChatPrompt:
        """A conversation (with its tools) rendered by the chat template, which adds
        special tokens. `template_kwargs` are the template's own variables (e.g.
        enable_thinking). With `tokens_per_image` (a vision-language model, whose
        engine takes text), the rendered text is kept, and the ids count each image
        tag as the tokens its image costs (the caller has broken the tags and, unless
        `parse_special`, the special tokens in the messages' text: engine_text).
        Otherwise special-token text in the messages and tools is tokenized as text,
        unless `parse_special` (plain_text.py, template_text.py)."""

        def render(messages: list[dict[str, Any]], shown_tools: list[dict[str, Any]] | None) -> str:
            try:
                return str(
                    self._tokenizer.apply_chat_template(
                        messages,
                        add_generation_prompt=add_generation_prompt,
                        tools=shown_tools or None,
                        extra_context=template_kwargs or None,
                    )
                )
            except Exception as exc:  # noqa: BLE001 (a template error is about the messages sent)
                raise PromptError(
                    f"The chat template could not render these messages: {template_error(exc)}", "messages"
                ) from None

        plain = self._plain_text
        if tokens_per_image is not None or self._parses_special(parse_special):
            prompt = render(history, tools)
            opens_reasoning = prompt.rstrip().endswith(THINK_OPEN)
            if tokens_per_image is None:
                return ChatPrompt(self._encode(prompt, add_special_tokens=False), opens_reasoning)
            # The engine encodes the text adding its tokenizer's special tokens: where
            # the template wrote BOS too, the engine's stands for it (else it runs two).
            text = self._without_added_bos(prompt)
            ids = self._added_before + self._count_with_images(text, tokens_per_image) + self._added_after
            return ChatPrompt(ids, opens_reasoning, text=text)
        rendered = render_with_text(render, history, tools or [], plain)
        return ChatPrompt(self._encode_rendered(rendered), rendered.text.rstrip().endswith(THINK_OPEN))

    def _encode_rendered(self, rendered: TemplateRender) -> list[int]:
        """The ids of a rendered conversation: the special tokens the template wrote as
        their ids, all other text (the template's and the messages') as text, in runs
        cut only at those special tokens."""
        plain = self._plain_text
        if not rendered.client_spans:  # nothing in the messages reads as a special token
            return self._encode(rendered.text, add_special_tokens=False)
        assert plain.special is not None and plain.tokenizer is not None
        ids: list[int] = []
        run: list[str] = []

        def flush() -> None:
            if run:
                ids.extend(self._encode("".join(run), add_special_tokens=False, tokenizer=plain.tokenizer))
                run.clear()

        for piece, from_client in rendered.pieces():
            if from_client:
                run.append(piece)
                continue
            at = 0
            for match in plain.special.finditer(piece):
                run.append(piece[at : match.start()])
                flush()
                ids.extend(self._encode(match[0], add_special_tokens=False))
                at = match.end()
            run.append(piece[at:])
        flush()
        return ids

    def _without_added_bos(self, text: str) -> str:
        """`text` without the special tokens it begins with that the tokenizer adds
        itself when it encodes a text (a template that writes `<bos>` first, for a
        tokenizer that adds it)."""
        if not self._added_before:
            return text
        added = self._tokenizer.decode(self._added_before, skip_special_tokens=False)
        return text[len(added) :] if added and text.startswith(added) else text

    def _count_with_images(self, text: str, tokens_per_image: int) -> list[int]:
        """The ids of `text` with each image tag standing for its image's tokens, as
        special placeholder ids that no detokenizer shows."""
        ids: list[int] = []
        pieces = _IMAGE_TAG.split(text)
        for i, piece in enumerate(pieces):
            if piece:
                ids += self._encode(piece, add_special_tokens=False)
            if i < len(pieces) - 1:
                ids += self.image_placeholders(1, tokens_per_image)
        return ids

    def image_placeholders(self, images: int, tokens_per_image: int) -> list[int]:
        """The ids that stand for `images` images in a prompt's count: the end-of-sequence
        token's, a special token no detokenizer shows."""
        return [max(self._tokenizer.get_eos_token_id(), 0)] * (images * tokens_per_image)

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

    def special_tokens(self) -> dict[str, Any]:
        """The tokenizer's BOS, EOS and padding tokens (text and id; None where it has
        none) and its chat template, as a remote tokenizer client reads them."""
        info: dict[str, Any] = {}
        for name in ("bos", "eos", "pad"):
            text = getattr(self._tokenizer, f"get_{name}_token")()
            token_id = getattr(self._tokenizer, f"get_{name}_token_id")()
            info[f"{name}_token"] = text or None
            info[f"{name}_token_id"] = token_id if text and token_id >= 0 else None
        info["chat_template"] = self._tokenizer.chat_template or None
        return info

    def decode(self, ids: list[int]) -> str:
        """The text of `ids`, special tokens included (vLLM's /detokenize keeps them, and
        text made from ids, such as an echoed prompt, must tokenize back to them)."""
        return self._tokenizer.decode(ids, skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes of one token (a partial UTF-8 character for some)."""
        if self._vocabulary is not None and token_id < len(self._vocabulary.token_bytes):
            return self._vocabulary.token_bytes[token_id]
        return self._tokenizer.decode([token_id], skip_special_tokens=False).encode()

    def output_bytes(
        self, skip_special_tokens: bool, keep_special_token_ids: frozenset[int] = frozenset()
    ) -> Callable[[int], bytes]:
        """What each generated token adds to the output text, as bytes: its own bytes, or
        none for a special token that skip_special_tokens leaves out (so logprob entries
        join to exactly the text)."""
        if not skip_special_tokens:
            return self.token_bytes
        if self._vocabulary is None:  # the engine's detokenizer knows which tokens it skips
            return lambda token_id: self._tokenizer.decode([token_id], skip_special_tokens=True).encode()
        skipped = self._vocabulary.special_ids - keep_special_token_ids

        def output_bytes(token_id: int) -> bytes:
            return b"" if token_id in skipped else self.token_bytes(token_id)

        return output_bytes

    def checked_ids(self, ids: list[int], param: str) -> list[int]:
        """Token ids a client sent, each checked against the vocabulary."""
        if self._vocab_size is not None:
            for i, token_id in enumerate(ids):
                if token_id >= self._vocab_size:
                    raise PromptError(
                        f"Invalid value for '{param}[{i}]': token id {token_id} is not in the model's"
                        f" vocabulary of {self._vocab_size} tokens.",
                        f"{param}[{i}]",
                    )
        return list(ids)

    def _encode(self, text: str, *, add_special_tokens: bool, tokenizer: Any = None) -> list[int]:
        """`text` through the tokenizer (or `tokenizer`, the copy that splits no special
        tokens)."""
        tokenizer = tokenizer or self._tokenizer
        if self._cut_at is None or len(text) <= WHOLE_TEXT_CHARS:
            ids = self._tokenize(tokenizer, text, add_special_tokens)
            if self._cut_at is None or len(ids) < self._cut_at:
                return ids
        # Perhaps cut short by the tokenizer (see ovtrio.text.pieces): tokenize in pieces
        # small enough to stay under the cut even at several tokens per character. A
        # text longer than WHOLE_TEXT_CHARS goes to pieces at once: tokenizing it whole
        # would hold the GIL, and with it the event loop, for tens of milliseconds.
        ids = []
        for i, piece in enumerate(word_pieces(text, max(1, self._cut_at // 4))):
            ids.extend(self._tokenize(tokenizer, piece, add_special_tokens and i == 0))
            # The tokenizer holds the GIL; between pieces the event loop gets it at once
            # (long texts are tokenized in a worker thread, see api/text_limits.py).
            time.sleep(0)
        return ids

    @staticmethod
    def _tokenize(tokenizer: Any, text: str, add_special_tokens: bool) -> list[int]:
        if not text and not add_special_tokens:
            return []
        encoded = tokenizer.encode(text, add_special_tokens=add_special_tokens)
        return encoded.input_ids.data[0].tolist()


def _tokenizer_vocabulary(tokenizer: Any) -> dict[str, int] | None:
    """The tokenizer's vocabulary (each token as written, with its id), if it lists one."""
    try:
        vocabulary = tokenizer.get_vocab()
    except (AttributeError, RuntimeError):
        return None
    return vocabulary if isinstance(vocabulary, dict) else None


def _vocab_size(vocabulary: dict[str, int] | None) -> int | None:
    """How many ids the tokenizer's vocabulary spans (its largest id, plus one)."""
    return max(vocabulary.values(), default=-1) + 1 if vocabulary else None


def _longest_token_chars(vocabulary: dict[str, int] | None) -> int:
    """Characters of the vocabulary's longest token as written in the vocabulary (a
    byte-level vocabulary writes each byte as one character, so this bounds the
    characters of text one token stands for); 64 when the tokenizer lists no vocabulary."""
    return max((len(token) for token in vocabulary), default=64) if vocabulary else 64


def template_error(exc: BaseException) -> str:
    """What the template engine says went wrong, without the paths it was built from:
    Minja's own error line (where in the template, and why) rather than the engine's
    general advice around it."""
    for line in str(exc).splitlines():
        if line.startswith("Minja's error:"):
            return line[len("Minja's error:") :].strip()
    return client_reason(exc)
