"""The `{"tool_calls": [...]}` reply that OpenVINO GenAI's tool polyfill teaches models
without tool support of their own."""

from __future__ import annotations

import json

from ovtrio.parsing.json_scan import VALUE_STARTS, JsonValue
from ovtrio.parsing.tool_calls import State, ToolCallParser


class JsonToolCallsParser(ToolCallParser):
    """The reply OpenVINO GenAI's tool polyfill teaches models whose chat template has no
    tools of its own (SmolLM2, ...): the whole output is one JSON object,

        {"tool_calls": [{"name": "f", "arguments": {...}, "id": "call_1"}], "content": ""}

    usually pretty-printed. Keys come in any order within a call (the model's "id" is
    replaced by ours); "content", a string (or null), may come before or after
    "tool_calls", and its decoded value, once complete, is the message content. Other
    keys after "tool_calls" are skipped.

    The decision is made once, at the start: only output that begins (after whitespace)
    with "{" and the key "tool_calls", or "content" and then "tool_calls", is read as a
    reply; anything else, plain JSON included, is content as generated. The reply is
    certain once its first call is announced (or an empty array closed). Until then,
    a reply that goes wrong or breaks off is given back whole, as content. After, the
    calls stay, and what was read since the last call is content if the reply goes wrong
    or breaks off there, except that output ending where a "]" or "}" was due (a
    dropped closing bracket, max_tokens between calls) just ends the reply.
    """

    def __init__(self) -> None:
        super().__init__()
        self._token: JsonValue | None = None  # the outer key or value being read
        self._key: str | None = None
        self._text: str | None = None  # content read before tool_calls, given when certain
        self._content_seen = False
        self._array_done = False
        self._reply = False  # certain: a call announced, or the array closed

    def _initial_state(self) -> State:
        return self._at_start

    def _announce(self, name: str) -> None:
        self._commit()
        super()._announce(name)

    def _commit(self) -> None:
        if not self._reply:
            self._reply = True
            if self._text:
                self._content.append(self._text)

    def _at_start(self, final: bool) -> bool:
        pos = self._space_end()
        if pos == len(self._buf) and not final:
            return False
        if self._buf.startswith("{", pos):
            self._open_call(self._buf[: pos + 1])  # raw text of the reply, from the start
            self._buf = self._buf[pos + 1 :]
            self._state = self._key_or_end
        else:
            self._state = self._plain
        return True

    # The outer object. Its raw text gathers in the pending call (since the start, or
    # since the last call), given back as content if the reply breaks.

    def _peek(self, final: bool) -> str | None:
        """The next character after whitespace; "" at the end, None to wait for more."""
        self._take_space_into_call()
        if self._buf:
            return self._buf[0]
        return "" if final else None

    def _stop(self, ended: bool) -> bool:
        """The reply cannot go on: the output ended between two of its parts (ended), or
        has something else there."""
        if ended and self._reply:
            self._call = None  # a missing "]" or "}": the reply just ends
        else:
            self._give_back_call()
        self._state = self._plain
        return True

    def _wanted(self, key: str) -> bool:
        """Whether key may come next; before tool_calls only content (once) may precede it."""
        return self._array_done or key == "tool_calls" or (key == "content" and not self._content_seen)

    def _key_or_end(self, final: bool) -> bool:
        char = self._peek(final)
        if char is None:
            return False
        if char == '"':
            self._token, self._state = JsonValue(), self._in_key
            return True
        if char == "}" and self._array_done:  # after a comma too: forgiven
            return self._end_reply()
        return self._stop(not char)

    def _in_key(self, final: bool) -> bool:
        token = self._token
        assert token is not None  # set by the state before
        self._take_into_call(token.consume(self._buf))
        if not token.done:
            if final:
                return self._stop(False)
            # Decide as soon as the key cannot become a wanted one (escapes: wait for its end).
            if not self._array_done and "\\" not in token.text:
                wanted = [json.dumps(key) for key in ("tool_calls", "content") if self._wanted(key)]
                if not any(key.startswith(token.text) for key in wanted):
                    return self._stop(False)
            return False
        try:
            key = json.loads(token.text)
        except ValueError:
            return self._stop(False)
        if not self._wanted(key):
            return self._stop(False)
        self._key, self._state = key, self._colon
        return True

    def _colon(self, final: bool) -> bool:
        char = self._peek(final)
        if char is None:
            return False
        if char != ":":
            return self._stop(not char)
        self._take_into_call(1)
        self._state = self._value_start
        return True

    def _value_start(self, final: bool) -> bool:
        char = self._peek(final)
        if char is None:
            return False
        if self._key == "tool_calls" and not self._array_done:
            if char != "[":
                return self._stop(not char)
            self._take_into_call(1)
            self._state = self._array_item
        elif char and char in VALUE_STARTS:
            self._token, self._state = JsonValue(), self._in_value
        else:
            return self._stop(not char)
        return True

    def _in_value(self, final: bool) -> bool:
        token = self._token
        assert token is not None  # set by the state before
        self._take_into_call(token.consume(self._buf))
        if not token.done:
            return self._stop(False) if final else False
        if self._key == "content" and not self._content_seen:
            self._content_seen = True
            try:
                text = json.loads(token.text)
            except (ValueError, RecursionError):  # RecursionError: nested too deep to decode
                text = False  # unreadable: as unusable as any value but a string or null
            if isinstance(text, str):
                if self._reply:
                    self._content.append(text)
                else:
                    self._text = text
            elif text is not None and not self._reply:
                return self._stop(False)
        self._state = self._after_value
        return True

    def _after_value(self, final: bool) -> bool:
        char = self._peek(final)
        if char is None:
            return False
        if char == ",":
            self._take_into_call(1)
            self._state = self._key_or_end
            return True
        if char == "}" and self._array_done:
            return self._end_reply()
        return self._stop(not char)

    def _end_reply(self) -> bool:
        self._buf = self._buf[1:]
        self._call = None
        self._state = self._after_reply
        return True

    # The tool_calls array

    def _array_item(self, final: bool) -> bool:
        """In the array where a call object is expected (or the array's end)."""
        char = self._peek(final)
        if char is None:
            return False
        if char == "]":
            self._buf = self._buf[1:]
            self._end_array()
        elif char == "{":
            self._then, self._fallback = self._array_next, self._plain
            self._state = self._before_object
        else:
            return self._stop(not char)
        return True

    def _array_next(self, final: bool) -> bool:
        """After a call: "," and the next one, or "]"."""
        if self._call is None:
            self._open_call("")
        char = self._peek(final)
        if char is None:
            return False
        if char == ",":
            self._take_into_call(1)
            self._state = self._array_item
        elif char == "]":
            self._buf = self._buf[1:]
            self._end_array()
        else:
            return self._stop(not char)
        return True

    def _end_array(self) -> None:
        self._array_done = True
        self._commit()
        self._open_call("")  # what was read so far is settled
        self._state = self._after_value

    # After the reply, or instead of it

    def _after_reply(self, final: bool) -> bool:
        """Text after the reply's closing brace is content, unless it is only whitespace."""
        if self._space_end() == len(self._buf):
            if final:
                self._buf = ""
            return False
        self._state = self._plain
        return True
