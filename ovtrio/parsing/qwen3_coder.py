"""Qwen3-Coder tool calls: XML, `<tool_call><function=NAME><parameter=X>value</parameter>…`."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import Any

from ovtrio.parsing.tool_calls import State, ToolCallParser, partial_tag_at_end

Schemas = dict[str, dict[str, Any]]


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


class Qwen3CoderToolParser(ToolCallParser):
    """Qwen3-Coder (and Qwen3.5's XML form), as its chat template renders past calls:

        <tool_call>
        <function=get_weather>
        <parameter=city>
        Paris
        </parameter>
        </function>
        </tool_call>

    The values are bare text, so the arguments JSON is built here, a parameter at a time:
    the call is announced at `<function=NAME>`, and each parameter is streamed as
    `"name": value` once its close tag comes. A value is a JSON string unless the tool's
    schema (`schemas`, by function name) gives the parameter a type other than string and
    the text reads as JSON (a boolean also as Python's True or False); without a schema,
    text that reads as a JSON number, boolean, null, object or array is that value. The
    newline the template writes on each side of a value is not part of it. A missing
    `<tool_call>` before `<function=` is forgiven, as are missing close tags. Output cut
    off inside a value keeps what was written of it, as a string.
    """

    OPEN = "<tool_call>"
    CLOSE = "</tool_call>"
    FUNCTION = "<function="
    FUNCTION_END = "</function>"
    PARAMETER = "<parameter="
    PARAMETER_END = "</parameter>"
    MARKERS = (OPEN, CLOSE)
    _MAX_NAME = 256

    @classmethod
    def for_request(cls, schemas: dict[str, Any]) -> Callable[[], ToolCallParser]:
        return partial(cls, schemas)

    def __init__(self, schemas: Schemas | None = None) -> None:
        super().__init__()
        self._schemas = schemas or {}
        self._params: list[str] = []  # "name": value, for each parameter read
        self._param: str | None = None
        self._scanned = 0  # characters of the buffer known to hold no end of the value

    def _initial_state(self) -> State:
        return self._in_content

    def _in_content(self, final: bool) -> bool:
        marker = self._pass_content_until_any((self.OPEN, self.FUNCTION), final)
        if marker is None:
            return False
        self._state = self._in_function_name if marker == self.FUNCTION else self._before_function
        return True

    def _before_function(self, final: bool) -> bool:
        self._take_space_into_call()
        if not self._buf and not final:
            return False
        if self._buf.startswith(self.FUNCTION):
            self._take_into_call(len(self.FUNCTION))
            self._state = self._in_function_name
        elif not final and self.FUNCTION.startswith(self._buf):
            return False
        else:
            self._give_back_call()
            self._state = self._in_content
        return True

    def _in_function_name(self, final: bool) -> bool:
        # A name is one line, up to ">": the same text is judged the same way, whether the
        # ">" has come yet or not.
        end = self._buf.find(">", 0, self._MAX_NAME + 1)
        text = self._buf[: self._MAX_NAME + 1] if end < 0 else self._buf[:end]
        name = text.strip()
        if "<" in text or "\n" in text or len(text) > self._MAX_NAME or (end >= 0 and not name) or (end < 0 and final):
            self._give_back_call()
            self._state = self._in_content
            return True
        if end < 0:
            return False
        self._take_into_call(end + 1)
        self._announce(name)
        self._params = []
        self._send_arguments("{")
        self._state = self._in_function
        return True

    def _in_function(self, final: bool) -> bool:
        """Between parameters: the next one, or the end of the function."""
        self._take_space_into_call()
        buf = self._buf
        if buf.startswith(self.PARAMETER):
            end = buf.find(">")
            if end < 0:
                if final:
                    return self._end_call()
                return False
            self._param = buf[len(self.PARAMETER) : end].strip()
            self._take_into_call(end + 1)
            self._state = self._in_value
            return True
        for closing in (self.FUNCTION_END, self.CLOSE):
            if buf.startswith(closing):
                self._take_into_call(len(closing))
                if closing == self.FUNCTION_END:
                    return True  # the call's close tag may follow
                return self._end_call()
        if not final and any(tag.startswith(buf) for tag in (self.PARAMETER, self.FUNCTION_END, self.CLOSE)):
            return False
        return self._end_call()

    def _in_value(self, final: bool) -> bool:
        tags = (self.PARAMETER_END, self.PARAMETER, self.FUNCTION_END)
        # A value (a whole file, for a coder) waits here until it ends: look only at
        # what is new, and what may complete a tag begun before it.
        start = max(0, self._scanned - max(map(len, tags)) + 1)
        ends = [at for tag in tags if (at := self._buf.find(tag, start)) >= 0]
        if not ends:
            self._scanned = len(self._buf)
            if not final:
                return False
            self._add_param(self._buf)
            self._take_into_call(len(self._buf))
            return self._end_call()
        at = min(ends)
        self._scanned = 0
        self._add_param(self._buf[:at])
        self._take_into_call(at)
        if self._buf.startswith(self.PARAMETER_END):
            self._take_into_call(len(self.PARAMETER_END))
        self._state = self._in_function
        return True

    def _add_param(self, text: str) -> None:
        if text.startswith("\n"):
            text = text[1:]
        if text.endswith("\n"):
            text = text[:-1]
        assert self._param is not None and self._call is not None and self._call.name is not None
        member = json.dumps(self._param, ensure_ascii=False) + ": " + self._value(self._call.name, self._param, text)
        self._send_arguments((", " if self._params else "") + member)
        self._params.append(member)

    def _value(self, function: str, param: str, text: str) -> str:
        """The JSON text of a parameter's value."""
        spec = self._schemas.get(function, {}).get("properties", {}).get(param, {})
        kind = spec.get("type") if isinstance(spec, dict) else None
        kinds = kind if isinstance(kind, list) else [kind]
        if "boolean" in kinds and text.strip().lower() in ("true", "false"):
            return text.strip().lower()  # a coder writes Python's True and False
        if "string" not in kinds:
            try:
                # NaN, Infinity and numbers too large for a float read as Python's JSON
                # reader allows, but no client's reader takes them back: they are text.
                value = json.loads(text, parse_constant=_not_json)
                if not isinstance(value, str):
                    return json.dumps(value, ensure_ascii=False, allow_nan=False)
            except (ValueError, RecursionError):  # RecursionError: nested too deep to decode
                pass
        return json.dumps(text, ensure_ascii=False)

    def _end_call(self) -> bool:
        self._finish_call("{" + ", ".join(self._params) + "}")
        self._param = None
        self._state = self._after_call
        return True

    def _after_call(self, final: bool) -> bool:
        """After a function: the call's close tag if it is there, then content."""
        rest = self._buf[self._space_end() :]
        if rest.startswith(self.CLOSE):
            self._buf = rest[len(self.CLOSE) :]
        elif not final and (not rest or partial_tag_at_end(rest, self.CLOSE) == len(rest)):
            return False
        self._state = self._in_content
        return True
