"""Base64 data URLs lifted out of a large request body before it is parsed.

Parsing holds the GIL, so a thread would not help: pydantic's JSON reader spends
milliseconds on a chat body with a few megabytes of data URLs, and the event loop stands
still meanwhile (measured in docs/benchmarks.md#request-bodies). A data URL needs none
of that parsing: it is one long ASCII string with no escapes. So before such a body is
parsed, each data URL (found with bytes.find, which scans at memory speed, and read as
a str, with the event loop served between two) is replaced by a short placeholder, the
small remainder is parsed, and the placeholders in the parsed body are replaced by the
strings.

A string is lifted only when it is certainly one whole JSON string: it starts at a
quote, not escaped, followed by `data:` (in valid JSON a quote followed by a letter
opens a string), it holds no backslash, so the next quote closes it, and it is ASCII.
Anything else stays in the JSON and is parsed with it. (A raw control character in a
lifted string, which JSON forbids, is not looked for, since that would cost more than
the parse saved; in an image's URL it is not base64, a 400 naming the part.)

A lifted string skips the checks its field makes (a placeholder is short), so only the
fields that hold images' data URLs may keep one: a model names them in `LIFTED_FIELDS`.
When a string lands anywhere else (a `metadata` key or value, a text), `restore` says so and the
caller parses the whole body as it came, with every check.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

import trio
from pydantic import BaseModel

# Bodies up to this size are parsed whole, and strings shorter than LIFTED_MIN_BYTES are
# left to the parser: it reads them fast enough.
LIFTED_FROM_BODY_BYTES = 1024 * 1024
LIFTED_MIN_BYTES = 64 * 1024

# Placeholders carry a per-process secret, so no client can write one itself.
_PLACEHOLDER = f"data:,lifted-{secrets.token_hex(8)}-"
# Reading one data URL takes the loop three scans and a copy of megabytes (longer when
# other threads share the memory bus). Bodies that arrive together would each read one
# in the same pass of trio's run loop, which then serves no socket until all are read;
# one body at a time, a pass reads one (docs/benchmarks.md#request-bodies).
_ONE_BODY_AT_A_TIME = trio.Lock()
_BACKSLASH = 0x5C


@dataclass
class LiftedBody:
    """A body's JSON with its long data URLs replaced by placeholders, and the URLs."""

    json: bytes | bytearray | str
    strings: dict[str, str] = field(default_factory=dict)

    def restore(self, body: object) -> bool:
        """Put the lifted strings back into the parsed body, in place of their placeholders;
        whether every one of them was in a field that may hold one (a model's
        `LIFTED_FIELDS`). When not, the body must be parsed again from the whole JSON."""
        if not self.strings:
            return True
        misplaced: list[str] = []
        _restore(body, self.strings, misplaced)
        return not misplaced


async def lift_data_urls(raw: bytes | bytearray | str) -> LiftedBody:
    """`raw` (an HTTP body, or a WebSocket text frame) with its long data URLs lifted out;
    the loop is served between two of them. A body of at most LIFTED_FROM_BODY_BYTES is
    left as it is."""
    if len(raw) <= LIFTED_FROM_BODY_BYTES:
        return LiftedBody(raw)
    text_form = isinstance(raw, str)
    opening_mark, quote, backslash = ('"data:', '"', "\\") if text_form else (b'"data:', b'"', b"\\")
    view: Any = raw if isinstance(raw, str) else memoryview(raw)  # bytes: slices without copies
    pieces: list[Any] = []
    strings: dict[str, str] = {}
    kept_from = 0
    search_from = 0
    find: Any = raw.find
    async with _ONE_BODY_AT_A_TIME:
        while (opening := find(opening_mark, search_from)) >= 0:
            closing = find(quote, opening + 1)
            if closing < 0:
                break
            search_from = closing + 1
            if closing - opening - 1 < LIFTED_MIN_BYTES or _escaped(raw, opening):
                continue
            if find(backslash, opening, closing) >= 0:
                continue
            string = _ascii(view[opening + 1 : closing])
            if string is None:
                continue
            placeholder = f"{_PLACEHOLDER}{len(strings)}"
            strings[placeholder] = string
            pieces += [view[kept_from : opening + 1], placeholder if text_form else placeholder.encode()]
            kept_from = closing
            await trio.lowlevel.checkpoint()
    if not strings:
        return LiftedBody(raw)
    pieces.append(view[kept_from:])
    return LiftedBody("".join(pieces) if text_form else b"".join(pieces), strings)


def _ascii(text: memoryview | str) -> str | None:
    """The text as a str if it is ASCII (a str knows; bytes are checked as they are decoded)."""
    if isinstance(text, str):
        return text if text.isascii() else None
    try:
        return str(text, "ascii")
    except UnicodeDecodeError:
        return None


def _escaped(raw: bytes | bytearray | str, quote: int) -> bool:
    """Whether the quote at `quote` is escaped: preceded by an odd run of backslashes."""
    run = 0
    while quote - run - 1 >= 0 and raw[quote - run - 1] in (_BACKSLASH, "\\"):
        run += 1
    return run % 2 == 1


def _restore(node: Any, strings: dict[str, str], misplaced: list[str], field_ok: bool = False) -> Any:
    """`node` with every placeholder string in it replaced, walking models, lists, tuples
    and dicts (in place where it can); a placeholder found outside a model's
    LIFTED_FIELDS (`field_ok`: the node is such a field's value) is added to `misplaced`."""
    if isinstance(node, str):
        if not node.startswith(_PLACEHOLDER) or node not in strings:
            return node
        if not field_ok:
            misplaced.append(node)
        return strings[node]
    if isinstance(node, BaseModel):
        fields: frozenset[str] = getattr(node, "LIFTED_FIELDS", frozenset())
        values = node.__dict__
        for name, value in values.items():
            values[name] = _restore(value, strings, misplaced, name in fields)
        extra = node.__pydantic_extra__
        if extra:
            _restore_dict(extra, strings, misplaced)
        return node
    if isinstance(node, list):
        for index, value in enumerate(node):
            node[index] = _restore(value, strings, misplaced)
        return node
    if isinstance(node, tuple):
        return tuple(_restore(value, strings, misplaced) for value in node)
    if isinstance(node, dict):
        _restore_dict(node, strings, misplaced)
    return node


def _restore_dict(node: dict[Any, Any], strings: dict[str, str], misplaced: list[str]) -> None:
    """`node`'s keys and values restored in place, in their order. A key is never an
    image's field: a lifted one is misplaced, since as a placeholder it skipped the
    checks its dict makes of keys (a `metadata` key's length)."""
    items = list(node.items())
    node.clear()
    for key, value in items:
        if isinstance(key, str) and key in strings:
            misplaced.append(key)
            key = strings[key]
        node[key] = _restore(value, strings, misplaced)
