"""Llama 3 JSON tool calls: bare `{"name": ..., "parameters": ...}` objects, optionally after `<|python_tag|>`."""

from __future__ import annotations

from ovtrio.parsing.tool_calls import State, ToolCallParser


class Llama3JsonToolParser(ToolCallParser):
    """Llama 3.1 / 3.2 / 3.3 JSON tool calling: the whole output is

        <|python_tag|>{"name": "f", "parameters": {...}}; {"name": "g", ...}

    (the tag optional, "arguments" accepted for "parameters"). The decision is made once,
    at the start: only output whose first character (after whitespace and the optional
    tag) is "{" is read as calls, and an object without a name or parameters is given
    back as content. So a model answering with plain JSON, or with code after
    <|python_tag|>, still answers verbatim.
    """

    PYTHON_TAG = "<|python_tag|>"
    MARKERS = (PYTHON_TAG,)
    requires_args = True

    def _initial_state(self) -> State:
        return self._at_start

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
            self._then, self._fallback = self._between_calls, self._plain
            self._state = self._before_object
        else:
            self._state = self._plain
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
                self._state = self._plain
                return True
            pos += 1
        elif pos == len(self._buf):
            if not final:
                return False
            self._state = self._plain
            return True
        elif not self._buf.startswith("{", pos):
            self._state = self._plain
            return True
        self._open_call(self._buf[:pos])
        self._buf = self._buf[pos:]
        self._state = self._before_object
        return True
