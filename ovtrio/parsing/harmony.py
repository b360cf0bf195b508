"""gpt-oss's harmony format: the reply is a series of messages, each on a channel, and
tool calls are messages addressed to a function."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from typing import Any

from ovtrio.parsing.tool_calls import State, ToolCallParser, partial_tag_at_end

START = "<|start|>"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
CONSTRAIN = "<|constrain|>"
END = "<|end|>"
CALL = "<|call|>"
RETURN = "<|return|>"
_HEADER_STARTS = (START, CHANNEL)
_BODY_ENDS = (END, CALL, RETURN, START, CHANNEL)
_RECIPIENT = re.compile(r"\bto=(\S+?)(?=\s|<\||$)")
_CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z_]+)")
# The reply may go on with the prompt's last header, "<|start|>assistant": its recipient.
_HEADER_GOES_ON = re.compile(r"[ \t]{0,4}to=")
_MAYBE_GOES_ON = re.compile(r"[ \t]{0,4}(t(o=?)?)?")
_MAX_HEADER = 512  # a header is a role, a channel, a recipient and a format


class HarmonyParser(ToolCallParser):
    """The reply of gpt-oss after the prompt's `<|start|>assistant`:

        <|channel|>analysis<|message|>The user wants the weather.<|end|><|start|>assistant
        <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>

    (one line, broken here), or for an answer `...<|start|>assistant<|channel|>final<|message|>It is sunny.`
    Each message's channel says what it is: `analysis` is reasoning; `final` is the
    answer (content); `commentary` is a tool call when addressed (`to=functions.NAME`,
    before or after the channel) and otherwise a preamble the model shows the user
    (content). A message to a built-in tool (`to=browser.search`, `to=python`) is the
    model's own business: reasoning. A call is announced when its header is complete, and
    its body, the arguments JSON, is streamed as written (trimmed). With `calls` off (the
    request has no tools), a message to a function is content.

    The prompt ends with `<|start|>assistant`, so the reply may begin inside that header,
    with the recipient the template writes there for past calls:

        to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>

    A message ends at `<|end|>`, `<|call|>` or `<|return|>` (the last two end generation
    and may not be in the text), or where the next header begins. Text outside any
    message is content; a header the output ends in, or one too long to be one, is given
    back as content.
    """

    MARKERS = (START, CHANNEL, MESSAGE, CONSTRAIN, END, CALL, RETURN)
    CHANNELS = True

    @classmethod
    def for_request(cls, schemas: dict[str, Any]) -> Callable[[], ToolCallParser]:
        return partial(cls, bool(schemas))

    def __init__(self, calls: bool = True) -> None:
        super().__init__()
        self._read_calls = calls
        self._kind = "content"  # what the current message's body is: content, reasoning, call
        self._body = ""  # a call's arguments text so far, as streamed
        self._space: list[str] = []  # whitespace after it, held back

    def _initial_state(self) -> State:
        return self._at_start

    def _at_start(self, final: bool) -> bool:
        """The prompt's header going on (a recipient), or the reply's own messages."""
        if _HEADER_GOES_ON.match(self._buf):
            self._open_call("")
            self._state = self._header
        elif final or not _MAYBE_GOES_ON.fullmatch(self._buf):
            self._state = self._between
        else:
            return False  # "", " " or " to": wait
        return True

    def _between(self, final: bool) -> bool:
        """Outside messages: the next header, or text, which is content."""
        found = [at for marker in _HEADER_STARTS if (at := self._buf.find(marker)) >= 0]
        at = min(found) if found else -1
        if at < 0:
            keep = 0 if final else max(partial_tag_at_end(self._buf, m) for m in _HEADER_STARTS)
            self._emit_content(self._buf[: len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep :]
            return False
        self._emit_content(self._buf[:at])
        self._buf = self._buf[at:]
        self._open_call("")
        self._state = self._header
        return True

    def _header(self, final: bool) -> bool:
        at = self._buf.find(MESSAGE)
        if at < 0 or at > _MAX_HEADER:
            if at < 0 and not final and len(self._buf) <= _MAX_HEADER:
                return False
            self._take_into_call(min(len(self._buf), _MAX_HEADER))
            self._give_back_call()
            self._state = self._between
            return True
        header = self._buf[:at]
        self._take_into_call(at + len(MESSAGE))
        recipient = _RECIPIENT.search(header)
        channel = _CHANNEL_NAME.search(header)
        name = channel[1] if channel else ""
        target = recipient[1] if recipient else ""
        # A call to a function without a name is no call: its body is content.
        function = target[len("functions.") :] if target.startswith("functions.") else None
        if function and self._read_calls:
            self._announce(function)
            self._kind, self._body, self._space = "call", "", []
        else:
            self._call = None
            self._kind = "content" if function is not None or (not recipient and name != "analysis") else "reasoning"
        self._state = self._body_text
        return True

    def _body_text(self, final: bool) -> bool:
        """A message's body, up to its end (or the next header)."""
        found = [(at, marker) for marker in _BODY_ENDS if (at := self._buf.find(marker)) >= 0]
        if found:
            at, marker = min(found)
            text, self._buf = self._buf[:at], self._buf[at:]
            if marker not in _HEADER_STARTS:
                self._buf = self._buf[len(marker) :]
        else:
            keep = 0 if final else max(partial_tag_at_end(self._buf, m) for m in _BODY_ENDS)
            text, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep :]
        self._add_body(text)
        if not found and not final:
            return False
        if self._kind == "call":
            self._finish_call(self._body or "{}")
        self._kind = "content"
        self._state = self._between
        return bool(found)

    def _add_body(self, text: str) -> None:
        if self._kind == "reasoning":
            if text:
                self._reasoning.append(text)
        elif self._kind == "content":
            if text:
                self._emit_content(text)
        else:
            # The arguments as written, less the whitespace around them; whitespace is
            # held back until text follows it (only what is new is looked at).
            kept = text.rstrip()
            if not kept:
                if self._body:
                    self._space.append(text)
                return
            piece = "".join(self._space) + kept if self._body else kept.lstrip()
            self._space = [text[len(kept) :]]
            self._body += piece
            self._send_arguments(piece)
