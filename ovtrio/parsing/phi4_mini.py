"""Phi-4-mini tool calls: `<|tool_call|>[...]<|/tool_call|>`, or `functools[...]`."""

from __future__ import annotations

from ovtrio.parsing.ids import new_call_id
from ovtrio.parsing.json_scan import JsonValue
from ovtrio.parsing.mistral import MistralToolParser
from ovtrio.parsing.tool_calls import State


class Phi4MiniToolParser(MistralToolParser):
    """Phi-4-mini writes its calls as a JSON list (or one object) of
    {"name": ..., "arguments": ...} after a marker:

        <|tool_call|>[{"name": "f", "arguments": {...}}, ...]<|/tool_call|>
        functools[{"name": "f", "arguments": {...}}]

    (the first as its own template renders past calls, one object per tag; the second as
    the instructions of vLLM's and Ollama's templates ask). The close tag is optional.
    Apart from the markers, the array is read as Mistral's [TOOL_CALLS] one is, with
    OpenAI-style call ids.
    """

    TAG = "<|tool_call|>"
    CLOSE = "<|/tool_call|>"
    FUNCTOOLS = "functools"
    MARKERS = (TAG, CLOSE)
    _NAME_CHARS = frozenset()  # no bare-name form

    def _new_id(self) -> str:
        return new_call_id()

    def _initial_state(self) -> State:
        return self._in_content

    def __init__(self) -> None:
        super().__init__()
        self._close_due = False  # a call (or an empty list) was read: its close tag may come next

    def _close_call(self, name: str | None, args: JsonValue | None) -> None:
        super()._close_call(name, args)
        self._close_due = True

    def _drop_call(self) -> None:
        super()._drop_call()
        self._close_due = True

    def _in_content(self, final: bool) -> bool:
        if self._close_due:  # after the calls, their close tag (possibly split) is not content
            rest = self._buf[self._space_end() :]
            if rest.startswith(self.CLOSE):
                self._buf = rest[len(self.CLOSE) :]
            elif not final and self.CLOSE.startswith(rest):
                return False
            self._close_due = False
        marker = self._pass_content_until_any((self.TAG, self.FUNCTOOLS + "["), final)
        if marker is None:
            return False
        if marker != self.TAG:  # the "[" is the array's: put it back
            self._buf = "[" + self._buf
            assert self._call is not None
            self._call.raw = self._call.raw[:-1]
        self._fallback = self._in_content
        self._state = self._after_tag
        return True
