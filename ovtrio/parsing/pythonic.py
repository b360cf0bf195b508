"""Pythonic tool calls: a Python list of calls, `[get_weather(city="Paris"), ...]`
(Llama 3.2 and Llama 4 with their pythonic templates, Gemma 3)."""

from __future__ import annotations

import ast
import json
import string

from ovtrio.parsing.tool_calls import State, ToolCallParser

_NAME_START = frozenset(string.ascii_letters + "_")
_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_.-")


class PythonicToolParser(ToolCallParser):
    """The whole output is a list of calls with keyword arguments whose values are
    Python literals,

        [get_weather(city="Paris", unit="celsius"), add(a=1, b=[2, 3])]

    optionally between Llama 4's `<|python_start|>` and `<|python_end|>`. As with Llama
    3's JSON, the decision is made once, at the start: only output that begins with "["
    and a name and "(" is read as calls; anything else is content as generated. A call is
    announced at its "(", and each argument is streamed as `"name": value` (the literal
    as JSON: True as true, None as null, tuples as arrays) once its value ends. An
    argument that is not a literal, or has no JSON form (a set, 1e999), ends the calls:
    the calls read stay, and the text from there on is content. Output cut off inside a
    value keeps what was written of it, as a string.
    """

    START = "<|python_start|>"
    END = "<|python_end|>"
    MARKERS = (START, END)
    _MAX_NAME = 64

    def __init__(self) -> None:
        super().__init__()
        self._members: list[str] = []
        self._key = ""
        self._value = ""  # the value being read, as written
        self._quote = ""  # the quote of the string being read in the value, if any
        self._escaped = False
        self._depth = 0

    def _initial_state(self) -> State:
        return self._at_start

    def _at_start(self, final: bool) -> bool:
        buf = self._buf
        pos = self._space_end()
        if buf.startswith(self.START, pos):
            pos = self._space_end(pos + len(self.START))
        elif not final and self.START.startswith(buf[pos:]):
            return False  # nothing yet, or a partial tag: wait
        if pos == len(buf) and not final:
            return False
        if buf.startswith("[", pos):
            self._open_call(buf[: pos + 1])
            self._buf = buf[pos + 1 :]
            self._state = self._before_name
        else:
            self._state = self._plain
        return True

    def _give_up(self) -> bool:
        """Not (or no longer) calls: what was read of this call is content, as is the rest."""
        self._give_back_call()
        self._state = self._plain
        return True

    def _before_name(self, final: bool) -> bool:
        self._take_space_into_call()
        if not self._buf:
            return self._give_up() if final else False
        if self._buf[0] not in _NAME_START:
            return self._give_up()
        self._state = self._in_name
        return True

    def _in_name(self, final: bool) -> bool:
        count = 0
        while count < len(self._buf) and self._buf[count] in _NAME_CHARS:
            count += 1
        if count == len(self._buf) and not final and count <= self._MAX_NAME:
            return False
        name = self._buf[:count]
        rest = self._space_end(count)
        if rest == len(self._buf) and not final:
            return False
        if count > self._MAX_NAME or not self._buf.startswith("(", rest):
            return self._give_up()
        self._take_into_call(rest + 1)
        self._announce(name)
        self._members = []
        self._send_arguments("{")
        self._state = self._before_key
        return True

    def _before_key(self, final: bool) -> bool:
        """In the parentheses: the next keyword, or ")"."""
        pos = self._space_end()
        if pos == len(self._buf):
            return self._end_call(final, "") if final else False
        if self._buf[pos] == ")":
            self._buf = self._buf[pos + 1 :]
            self._end_call(False, "")
            self._state = self._after_call
            return True
        count = pos
        while count < len(self._buf) and count - pos <= self._MAX_NAME and self._buf[count] in _NAME_CHARS:
            count += 1
        if count - pos > self._MAX_NAME:
            return self._broken()
        after = self._space_end(count)
        if after == len(self._buf) and not final:
            return False
        if count == pos or not self._buf.startswith("=", after):
            return self._broken()
        self._key = self._buf[pos:count]
        self._buf = self._buf[after + 1 :]
        self._value, self._quote, self._escaped, self._depth = "", "", False, 0
        self._state = self._in_value
        return True

    def _in_value(self, final: bool) -> bool:
        """A literal, up to the "," or ")" that ends it outside strings and brackets."""
        end, stop = len(self._buf), ""
        for at, char in enumerate(self._buf):
            if self._quote:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == self._quote:
                    self._quote = ""
            elif char in "\"'":
                self._quote = char
            elif char in "([{":
                self._depth += 1
            elif char in ")]}" and self._depth > 0:
                self._depth -= 1
            elif char in ",)" and self._depth == 0:
                end, stop = at, char
                break
        self._value += self._buf[:end]
        if not stop:
            self._buf = ""
            return self._end_call(True, self._value) if final else False
        self._buf = self._buf[end + 1 :]
        try:
            member = json.dumps(ast.literal_eval(self._value.strip()), ensure_ascii=False, allow_nan=False)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            self._buf = self._key + "=" + self._value + stop + self._buf
            return self._broken()
        self._add(member)
        if stop == ")":
            self._end_call(False, "")
            self._state = self._after_call
        else:
            self._state = self._before_key
        return True

    def _add(self, value: str) -> None:
        member = json.dumps(self._key, ensure_ascii=False) + ": " + value
        self._send_arguments((", " if self._members else "") + member)
        self._members.append(member)

    def _end_call(self, cut: bool, partial: str) -> bool:
        """The call ends; `cut`: the output ended in it, `partial` the value begun."""
        if cut and partial.strip():
            self._add(json.dumps(partial, ensure_ascii=False))
        self._finish_call("{" + ", ".join(self._members) + "}")
        if cut:
            self._state = self._plain
        return True

    def _broken(self) -> bool:
        """An argument that does not read: the call ends with the arguments read, and
        the rest of the output is content."""
        self._end_call(False, "")
        self._state = self._plain
        return True

    def _after_call(self, final: bool) -> bool:
        """After a call's ")": "," and the next call, or "]" and the end of the list."""
        pos = self._space_end()
        if pos == len(self._buf):
            if final:
                self._buf = ""
                self._state = self._plain
                return True
            return False
        if self._buf[pos] == ",":
            self._open_call(self._buf[: pos + 1])
            self._buf = self._buf[pos + 1 :]
            self._state = self._before_name
            return True
        if self._buf[pos] == "]":
            self._buf = self._buf[pos + 1 :]
            self._state = self._after_list
            return True
        self._state = self._plain
        return True

    def _after_list(self, final: bool) -> bool:
        """After the list: Llama 4's end tag is not content."""
        rest = self._buf[self._space_end() :]
        if rest.startswith(self.END):
            self._buf = rest[len(self.END) :]
        elif not final and self.END.startswith(rest):
            return False
        self._state = self._plain
        return True
