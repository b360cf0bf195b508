"""Where a client's text lands in the prompt a chat template renders.

The template writes the turns' special tokens around the messages' text; to tokenize
the one as control tokens and the other as text (plain_text.py), the prompt must say
which characters came from which. The conversation is rendered twice: as sent, and with
each string that holds special-token text replaced by a unique placeholder. The
placeholders' positions in the second rendering, matched against the first, give the
spans of client text; a template that shows a string otherwise than as it is (trimmed,
or escaped as JSON, which are recognised) or not at all changes nothing. If the two
renderings cannot be matched (a template that takes such a string apart), the strings
are broken instead (PlainText.neutralised) and the conversation rendered once more:
the text then differs by an invisible character, but no special token reaches the
model from it.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ovtrio.text.plain_text import PlainText

# Renders messages with tools through the chat template.
Render = Callable[[list[dict[str, Any]], list[dict[str, Any]]], str]


@dataclass(frozen=True)
class TemplateRender:
    """A rendered conversation, and the spans of it that are client text holding
    special-token text (to be tokenized as text)."""

    text: str
    client_spans: tuple[tuple[int, int], ...] = ()

    def pieces(self) -> Iterator[tuple[str, bool]]:
        """The text in order, each piece with whether it is such client text."""
        at = 0
        for start, end in self.client_spans:
            yield self.text[at:start], False
            yield self.text[start:end], True
            at = end
        yield self.text[at:], False


def render_with_text(
    render: Render, messages: list[dict[str, Any]], tools: list[dict[str, Any]], plain: PlainText
) -> TemplateRender:
    """The conversation rendered, with the spans of client text that hold special-token
    text when there are any (see the module docstring)."""
    marked: list[str] = []
    nonce = secrets.token_hex(8)

    def mark(text: str) -> str:
        if not plain.holds_special(text):
            return text
        marked.append(text)
        return f"ovtriotext{nonce}n{len(marked) - 1}e"

    marked_messages, marked_tools = map_strings(messages, mark), map_strings(tools, mark)
    if not marked:
        return TemplateRender(render(messages, tools))
    if plain.tokenizer is not None:
        text = render(messages, tools)
        try:
            spans = _client_spans(render(marked_messages, marked_tools), text, marked, nonce)
        except ValueError:  # the template refused the placeholders (a PromptError): not the client's fault
            spans = None
        if spans is not None:
            return TemplateRender(text, spans)

    def broken(text: str) -> str:
        return plain.neutralised(text) if plain.holds_special(text) else text

    return TemplateRender(render(map_strings(messages, broken), map_strings(tools, broken)))


def _client_spans(marked: str, text: str, originals: list[str], nonce: str) -> tuple[tuple[int, int], ...] | None:
    """Where each placeholder of `marked` stands in `text`; None if they do not match."""
    parts = re.split(f"ovtriotext{nonce}n(\\d+)e", marked)
    if not text.startswith(parts[0]):
        return None
    at = len(parts[0])
    spans = []
    for k in range(1, len(parts), 2):
        after = parts[k + 1]
        for form in _forms(originals[int(parts[k])]):
            if text.startswith(form, at) and text.startswith(after, at + len(form)):
                break
        else:
            return None
        spans.append((at, at + len(form)))
        at += len(form) + len(after)
    return tuple(spans) if at == len(text) else None


def _forms(text: str) -> list[str]:
    """How a template may show a string: as it is, inside a JSON string (tojson), or
    trimmed."""
    forms = [text, json.dumps(text, ensure_ascii=False)[1:-1], json.dumps(text)[1:-1], text.strip()]
    return list(dict.fromkeys(forms))


def map_strings(value: Any, change: Callable[[str], str]) -> Any:
    """`value` (JSON-like: dicts, lists, strings) with `change` applied to every string,
    keys included: a template shows keys too (tool-call arguments through `tojson`, a
    tool's parameter names), so a key is client text like any value."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, dict):
        return {map_strings(key, change): map_strings(item, change) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [map_strings(item, change) for item in value]
    return value
