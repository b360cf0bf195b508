"""Llama 3 JSON tool calls: bare `{"name": ..., "parameters": ...}` objects, optionally after `<|python_tag|>`."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from ovtrio.parsing.tool_calls import State, ToolCallParser, partial_tag_at_end


class Llama3JsonToolParser(ToolCallParser):
    """Llama 3.1 / 3.2 / 3.3 JSON tool calling:

        <|python_tag|>{"name": "f", "parameters": {...}}; {"name": "g", ...}

    ("arguments" accepted for "parameters"; calls separated by ";" or whitespace). Where
    the calls may stand:

    - at the start of the reply (after whitespace), with or without the tag: an object
      with a name and parameters is a call, whatever the name;
    - after `<|python_tag|>` anywhere (text before it is content), likewise;
    - after leading text, without the tag, only when the request has tools: an object
      is a call only if its name is one of theirs ("Here are the results: {...}; {...}
      Would you like to know more?"), so prose with braces, or a JSON object that names
      no tool, stays content.

    Anything that turns out not to be a call is given back as content, as written (code
    after `<|python_tag|>`, a JSON answer); text around the calls is content. An object
    that may be a call is held back until that is known: at its name, or at its end.
    """

    PYTHON_TAG = "<|python_tag|>"
    MARKERS = (PYTHON_TAG,)
    requires_args = True

    @classmethod
    def for_request(cls, schemas: dict[str, Any]) -> Callable[[], ToolCallParser]:
        return partial(cls, frozenset(schemas))

    def __init__(self, tools: frozenset[str] = frozenset()) -> None:
        """`tools`: the request's function names; calls after text without the tag name one."""
        self._tools = tools
        self._tools_only = False  # the calls being read follow text without the tag
        super().__init__()

    def _initial_state(self) -> State:
        return self._at_start

    def _takes_name(self, name: str) -> bool:
        return name in self._tools or not self._tools_only

    def _at_start(self, final: bool) -> bool:
        buf = self._buf
        pos = self._space_end()
        if buf.startswith(self.PYTHON_TAG, pos):
            pos = self._space_end(pos + len(self.PYTHON_TAG))
        elif not final and self.PYTHON_TAG.startswith(buf[pos:]):
            return False  # nothing yet, or a partial tag: wait
        if pos == len(buf) and not final:
            return False
        if buf.startswith("{", pos):
            self._open_call(buf[:pos])
            self._buf = buf[pos:]
            self._then, self._fallback = self._between_calls, self._text
            self._state = self._before_object
        else:
            self._state = self._text
        return True

    def _text(self, final: bool) -> bool:
        """Content, up to a `<|python_tag|>` or (with tools) an object that may be a call."""
        tag = self._buf.find(self.PYTHON_TAG)
        brace = self._buf.find("{") if self._tools else -1
        if tag < 0 and brace < 0:
            keep = 0 if final else partial_tag_at_end(self._buf, self.PYTHON_TAG)
            self._emit_content(self._buf[: len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep :]
            return False
        if tag >= 0 and (brace < 0 or tag < brace):
            self._emit_content(self._buf[:tag])
            self._buf = self._buf[tag + len(self.PYTHON_TAG) :]
            self._open_call(self.PYTHON_TAG)
            self._tools_only = False
        else:
            self._emit_content(self._buf[:brace])
            self._buf = self._buf[brace:]
            self._open_call("")
            self._tools_only = True
        self._then, self._fallback = self._between_calls, self._text
        self._state = self._before_object
        return True

    def _between_calls(self, final: bool) -> bool:
        """After a call: ";" (or just whitespace) and another call, or content."""
        pos = self._space_end()
        if self._buf.startswith(";", pos):
            after = self._space_end(pos + 1)
            if after == len(self._buf):
                if not final:
                    return False
                self._buf = ""  # a trailing ";" separates nothing
                self._state = self._text
                return True
            pos += 1
        elif pos == len(self._buf):
            if not final:
                return False
            self._state = self._text
            return True
        elif not self._buf.startswith("{", pos):
            self._state = self._text
            return True
        self._open_call(self._buf[:pos])
        self._buf = self._buf[pos:]
        self._state = self._before_object
        return True
