"""Mistral tool calls: `[TOOL_CALLS]` and a JSON array, or `name[ARGS]{...}` per call."""

from __future__ import annotations

import string

from ovtrio.parsing.ids import new_mistral_call_id
from ovtrio.parsing.json_scan import VALUE_STARTS, JsonValue
from ovtrio.parsing.tool_calls import State, ToolCallParser


class MistralToolParser(ToolCallParser):
    """Mistral tool calling, `[TOOL_CALLS]` followed by either

        [{"name": "f", "arguments": {...}}, ...]       (Mistral 7B v0.3, Nemo)
        f[ARGS]{...}                                   (tokenizer v11+: Small 3.1+)
        f[CALL_ID]a1b2c3d4e[ARGS]{...}                 (as Small 3.2's template renders calls)

    In the newer form each call has its own [TOOL_CALLS]; "[ARGS]" may be absent when
    special tokens are not rendered. A single object without the array is accepted too.
    The model's own call id is not kept: calls get ids of the server's.

    Mistral's templates require 9-character alphanumeric call ids, so ids have that shape.
    """

    TAG = "[TOOL_CALLS]"
    ARGS = "[ARGS]"
    CALL_ID = "[CALL_ID]"
    MARKERS: tuple[str, ...] = (TAG, ARGS, CALL_ID)
    _NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_-.")
    _MAX_NAME = 64  # OpenAI's limit; longer is not a function name

    def __init__(self) -> None:
        super().__init__()
        self._name = ""
        self._args: JsonValue | None = None

    def _initial_state(self) -> State:
        return self._in_content

    def _new_id(self) -> str:
        return new_mistral_call_id()

    def _in_content(self, final: bool) -> bool:
        if not self._pass_content_until(self.TAG, final):
            return False
        self._fallback = self._in_content
        self._state = self._after_tag
        return True

    def _after_tag(self, final: bool) -> bool:
        """Which form follows the tag: an array, one object, or a bare name."""
        self._take_space_into_call()
        if not self._buf:
            if not final:
                return False
            self._give_back_call()
            self._state = self._in_content
        elif self._buf[0] == "[":
            self._take_into_call(1)
            self._state = self._array_item
        elif self._buf[0] == "{":
            self._then = self._in_content
            self._state = self._before_object
        elif self._buf[0] in self._NAME_CHARS:
            self._name = ""
            self._state = self._in_name
        else:
            self._give_back_call()
            self._state = self._in_content
        return True

    def _array_item(self, final: bool) -> bool:
        """In the array where an object is expected (or its end)."""
        self._take_space_into_call()
        if not self._buf and not final:
            return False
        if self._buf.startswith("]"):
            self._buf = self._buf[1:]
            self._drop_call()
            self._state = self._in_content
            return True
        self._then = self._array_next
        self._state = self._before_object
        return True

    def _array_next(self, final: bool) -> bool:
        """After an object in the array: "," and the next one, or "]"."""
        pos = self._space_end()
        if pos == len(self._buf) and not final:
            return False
        if self._buf.startswith(",", pos):
            self._open_call(self._buf[: pos + 1])
            self._buf = self._buf[pos + 1 :]
            self._state = self._array_item
            return True
        if self._buf.startswith("]", pos):
            self._buf = self._buf[pos + 1 :]
        self._state = self._in_content
        return True

    def _in_name(self, final: bool) -> bool:
        """The newer form's function name, up to [ARGS] (or straight to the JSON)."""
        count = 0
        while count < len(self._buf) and self._buf[count] in self._NAME_CHARS:
            count += 1
        self._name += self._buf[:count]
        self._take_into_call(count)
        if len(self._name) > self._MAX_NAME:
            self._give_back_call()
            self._state = self._in_content
            return True
        if self._buf.startswith(self.CALL_ID):
            self._take_into_call(len(self.CALL_ID))
            self._state = self._in_call_id
            return True
        if self._buf.startswith(self.ARGS):
            self._take_into_call(len(self.ARGS))
        elif not final and (self.ARGS.startswith(self._buf) or self.CALL_ID.startswith(self._buf)):
            return False  # "" or a partial [ARGS] or [CALL_ID]: wait
        elif not self._buf.startswith("{"):
            self._give_back_call()
            self._state = self._in_content
            return True
        self._state = self._before_args
        return True

    def _in_call_id(self, final: bool) -> bool:
        """The model's id for the call, up to [ARGS]: read past, not kept."""
        count = 0
        while count < len(self._buf) and self._buf[count].isalnum():
            count += 1
        self._take_into_call(count)
        if self._buf.startswith(self.ARGS):
            self._take_into_call(len(self.ARGS))
            self._state = self._before_args
        elif not final and self.ARGS.startswith(self._buf):
            return False
        else:
            self._give_back_call()
            self._state = self._in_content
        return True

    def _before_args(self, final: bool) -> bool:
        self._take_space_into_call()
        if not self._buf and not final:
            return False
        if self._buf and self._buf[0] in VALUE_STARTS:
            self._args = JsonValue()
            self._state = self._in_args
        else:
            self._give_back_call()
            self._state = self._in_content
        return True

    def _in_args(self, final: bool) -> bool:
        """The newer form's arguments: a bare JSON value, streamed as it comes."""
        args = self._args
        assert args is not None  # set by _before_args
        self._take_into_call(args.consume(self._buf))
        self._stream_call(self._name, args)
        if not (args.done or final):
            return False
        self._close_call(self._name, args)
        self._args = None
        self._state = self._in_content
        return True
