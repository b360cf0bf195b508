"""JSON read without parsing: where a value ends, and one call object's name and arguments,
found piece by piece as generated text streams in.

Only brackets, strings and escapes are tracked, so the text the model wrote is kept
verbatim (nothing is re-serialised) and streamed argument fragments add up byte for byte
to the final arguments.
"""

from __future__ import annotations

import json


def skip_space(text: str, start: int = 0) -> int:
    """Index of the first non-whitespace character of text at or after start."""
    while start < len(text) and text[start].isspace():
        start += 1
    return start


_JSON_SPACE = " \t\n\r"
VALUE_STARTS = frozenset('{["-0123456789tfn')
# Characters that can continue a bare number or true/false/null. A bare value has no
# closing character, so it ends at the first character that is not one of these.
_SCALAR_CHARS = frozenset("0123456789+-.eEtruefalsn")


class JsonValue:
    """The raw text of one JSON value, read piece by piece, and whether it has ended.

    Only brackets, strings and escapes are tracked: enough to find where the value ends
    (a "}" inside a string does not close anything), not a validation. That is on
    purpose: whatever the model wrote is kept verbatim, and judging it is up to the
    caller. The first character given must be a value start (see VALUE_STARTS).
    """

    def __init__(self) -> None:
        self.text = ""
        self.done = False
        self.trimmed_len = 0  # up to the last non-whitespace character
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._scalar = False

    @property
    def trimmed(self) -> str:
        return self.text[: self.trimmed_len]

    def consume(self, text: str, start: int = 0) -> int:
        """Read the characters of text from start that belong to the value; return how
        many."""
        end = start
        while end < len(text) and not self.done:
            char = text[end]
            if self._scalar and char not in _SCALAR_CHARS:
                self.done = True
                break
            end += 1
            if char not in _JSON_SPACE:
                self.trimmed_len = len(self.text) + end - start
            self._step(char)
        self.text += text[start:end]
        return end - start

    def _step(self, char: str) -> None:
        if self._in_string:
            if self._escaped:
                self._escaped = False
            elif char == "\\":
                self._escaped = True
            elif char == '"':
                self._in_string = False
                self.done = self._depth == 0
        elif char == '"':
            self._in_string = True
        elif char in "{[":
            self._depth += 1
        elif char in "}]":
            self._depth -= 1
            self.done = self._depth <= 0
        elif self._depth == 0:
            self._scalar = True


class CallObject:
    """One call object, `{"name": "f", "arguments": {...}}`, read piece by piece.

    Keys may come in any order and unknown keys are skipped. `name` is set once its
    string is complete; `args` is the arguments value as soon as it begins (the call can
    be announced and its arguments streamed while the object is still open). The object
    stops at its closing brace (`done`) or at the first character that does not fit
    (`failed`); that character is left unread for the caller to look at.
    """

    def __init__(self, args_keys: tuple[str, ...]) -> None:
        self.args_keys = args_keys
        self.state = "open"
        self.name: str | None = None
        self.args: JsonValue | None = None
        self._key: str | None = None
        self._token: JsonValue | None = None  # the key or value being read

    @property
    def done(self) -> bool:
        return self.state == "done"

    @property
    def failed(self) -> bool:
        return self.state == "failed"

    def consume(self, text: str) -> int:
        """Read as much of text as belongs to the object; return how many characters."""
        pos = 0
        while pos < len(text) and self.state not in ("done", "failed"):
            if self.state in ("key", "value"):
                assert self._token is not None  # these states read one
                pos += self._token.consume(text, pos)
                if self._token.done:
                    self._end_token()
            else:
                pos += self._structural(text[pos])
        return pos

    def _structural(self, char: str) -> int:
        """One character between keys and values; 1 if it was read, 0 if left for a
        token that starts with it, or for the caller if it does not fit."""
        if char in _JSON_SPACE and self.state != "open":
            return 1
        if self.state == "open" and char == "{":
            self.state = "key_or_end"
        elif self.state == "key_or_end" and char == '"':
            self._token, self.state = JsonValue(), "key"
            return 0
        elif self.state in ("key_or_end", "after_value") and char == "}":
            self.state = "done"  # after a comma too: a trailing comma is forgiven
        elif self.state == "colon" and char == ":":
            self.state = "value_start"
        elif self.state == "value_start" and char in VALUE_STARTS:
            self._token, self.state = JsonValue(), "value"
            if self._key in self.args_keys and self.args is None:
                self.args = self._token
            return 0
        elif self.state == "after_value" and char == ",":
            self.state = "key_or_end"
        else:
            self.state = "failed"
            return 0
        return 1

    def _end_token(self) -> None:
        assert self._token is not None
        if self.state == "key":
            try:
                self._key = json.loads(self._token.text)
            except ValueError:  # a bad escape in the key
                self.state = "failed"
                return
            self.state = "colon"
            return
        if self._key == "name" and self.name is None:
            try:
                name = json.loads(self._token.text)
            except (ValueError, RecursionError):  # RecursionError: nested too deep to decode
                name = None
            if not isinstance(name, str) or not name:
                self.state = "failed"
                return
            self.name = name
        self.state = "after_value"
