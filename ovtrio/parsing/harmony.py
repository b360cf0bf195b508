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
_STOPS = (END, CALL, RETURN)  # what ends a message
# Where a header ends: at its <|message|>, or (harmony's non-strict reading) at a stop or
# the next header's start, which leave the header's words as the message's text.
_HEADER_ENDS = (MESSAGE, *_STOPS, START)
_BODY_ENDS = (*_STOPS, START, CHANNEL)
# Markers with no place where they stand: dropped, the text on either side read on.
_STRAY = (MESSAGE, CONSTRAIN)
_MARKERS = (START, CHANNEL, MESSAGE, CONSTRAIN, *_STOPS)
_RECIPIENT = re.compile(r"\bto=(\S+?)(?=\s|<\||$)")
_CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z_]+)")
_ROLE = re.compile(r"assistant(?=\s|<\||$)")
_LONGEST_MARKER = max(len(marker) for marker in _MARKERS)
_ANY_MARKER = re.compile("|".join(re.escape(marker) for marker in _MARKERS))
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
    and may not be in the text), or where the next header begins. What the model writes
    out of place is read as openai/harmony's non-strict parser reads it, and no marker
    ever reaches the client:

    - text before any header is a message without a channel (content), ended by a stop;
    - a header that ends without its `<|message|>` (at a stop, at the next header, or
      longer than any header) holds its message's text: its channel says what it is,
      and its words other than the channel and the role are the text; a header the
      output ends in (max_tokens) began no message, and is dropped;
    - a marker where it has no place (`<|message|>` in a body, a stop between messages)
      is dropped, and the text on both sides is read on.
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
        """Outside messages: the next header, or text, which is content. A stop here ends a
        message that had no header (harmony reads text before the first header so), and a
        marker that has no place here is dropped: no marker is content."""
        at, marker = self._first(_MARKERS)
        if at < 0:
            self._emit_held_back(self._emit_content, final)
            return False
        self._emit_content(self._buf[:at])
        if marker in _HEADER_STARTS:
            self._buf = self._buf[at:]
            self._open_call("")
            self._state = self._header
        else:
            self._buf = self._buf[at + len(marker) :]
        return True

    def _header(self, final: bool) -> bool:
        at, marker = self._first(_HEADER_ENDS, 1)
        if not 0 <= at <= _MAX_HEADER:
            if final and len(self._buf) <= _MAX_HEADER:
                if _ANY_MARKER.search(self._buf):
                    # The output ended in a header (max_tokens): no message was begun, as
                    # harmony has it, and its start ("<|start|>ass") is no text of the reply.
                    self._buf, self._call = "", None
                else:  # text that only looked like the prompt's header going on ("to=do")
                    self._take_into_call(len(self._buf))
                    self._give_back_call()
                self._state = self._between
            elif final or len(self._buf) >= _MAX_HEADER + _LONGEST_MARKER:
                self._header_as_text(self._cut_at_most(_MAX_HEADER), whole=False)  # too long
            else:
                return False  # an end may come (or be the marker cut at the buffer's end)
            return True
        if marker != MESSAGE:
            self._header_as_text(at, whole=True)
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

    def _header_as_text(self, size: int, whole: bool) -> None:
        """A header that ends without its `<|message|>` (at a stop, at the next header,
        or going on too long), read as harmony's non-strict parser
        reads one: its channel says what the message is, and its words, less the channel
        and the role, are the message's text; the message goes on after them. `whole`:
        the header is all there (its end trimmed, as harmony trims it)."""
        header, self._buf = self._buf[:size], self._buf[size:]
        self._call = None
        channel = _CHANNEL_NAME.search(header)
        if channel:
            header = header[: channel.start()] + " " + header[channel.end() :]
        words = _ANY_MARKER.sub("", header.removeprefix(START)).lstrip()
        if role := _ROLE.match(words):
            words = words[role.end() :].lstrip()
        self._kind = "reasoning" if channel and channel[1] == "analysis" else "content"
        self._add_body(words.rstrip() if whole else words)
        self._state = self._body_text

    def _body_text(self, final: bool) -> bool:
        """A message's body, up to its end (or the next header)."""
        at, marker = self._first(_BODY_ENDS + _STRAY)
        if at < 0:
            self._emit_held_back(self._add_body, final)
            if not final:
                return False
        else:
            self._add_body(self._buf[:at])
            self._buf = self._buf[at:] if marker in _HEADER_STARTS else self._buf[at + len(marker) :]
            if marker in _STRAY:
                return True
        if self._kind == "call":
            self._finish_call(self._body or "{}")
        self._kind = "content"
        self._state = self._between
        return at >= 0

    def _first(self, markers: tuple[str, ...], start: int = 0) -> tuple[int, str]:
        """The first of `markers` in the buffer from `start`, and where: (-1, "") if none."""
        found = [(at, marker) for marker in markers if (at := self._buf.find(marker, start)) >= 0]
        return min(found) if found else (-1, "")

    def _cut_at_most(self, size: int) -> int:
        """`size`, or the start of a marker that goes on past it: a cut that splits no marker."""
        for found in _ANY_MARKER.finditer(self._buf, max(0, size - _LONGEST_MARKER), size + _LONGEST_MARKER):
            if found.start() < size < found.end():
                return found.start()
        return size

    def _partial_marker(self) -> int:
        """How much of the buffer's end may be a marker's start, to be held back."""
        if "<" not in self._buf[-_LONGEST_MARKER:]:
            return 0  # the common case, looked at cheaply: every marker begins with "<|"
        return max(partial_tag_at_end(self._buf, marker) for marker in _MARKERS)

    def _emit_held_back(self, emit: Callable[[str], None], final: bool) -> None:
        """Emit the buffer, less what may be the start of a marker (unless at the end)."""
        keep = 0 if final else self._partial_marker()
        emit(self._buf[: len(self._buf) - keep])
        self._buf = self._buf[len(self._buf) - keep :]

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
