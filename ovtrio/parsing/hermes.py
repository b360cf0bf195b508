"""Hermes-style tool calls: `<tool_call>{...}</tool_call>` (Hermes 2 Pro, Qwen2.5, Qwen3)."""

from __future__ import annotations

from ovtrio.parsing.tool_calls import State, ToolCallParser


class HermesToolParser(ToolCallParser):
    """Hermes 2 Pro, Qwen2.5, Qwen3:

        <tool_call>
        {"name": "f", "arguments": {...}}
        </tool_call>

    possibly several in a row, possibly after some content. A missing close tag is
    forgiven (stop strings often eat it), and so is a missing closing brace of the call
    object when the arguments were complete (small models drop it).
    """

    OPEN = "<tool_call>"
    CLOSE = "</tool_call>"
    MARKERS = (OPEN, CLOSE)

    def _initial_state(self) -> State:
        return self._in_content

    def _in_content(self, final: bool) -> bool:
        if not self._pass_content_until(self.OPEN, final):
            return False
        self._then, self._fallback = self._after_call, self._in_content
        self._state = self._before_object
        return True

    def _after_call(self, final: bool) -> bool:
        """After a call object: its close tag, or (if missing) content again."""
        rest = self._buf[self._space_end() :]
        if rest.startswith(self.CLOSE):
            self._buf = rest[len(self.CLOSE) :]
        elif not final and self.CLOSE.startswith(rest):
            return False  # "" or a partial close tag: wait
        self._state = self._in_content
        return True
