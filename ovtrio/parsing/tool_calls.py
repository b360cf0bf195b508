"""Tool calls out of generated text, read incrementally: the model writes its calls in a
model-specific format (Hermes `<tool_call>` tags, Llama 3 bare JSON, Mistral
`[TOOL_CALLS]`, the `{"tool_calls": [...]}` reply of OpenVINO GenAI's tool polyfill),
and the API answers with OpenAI tool calls.

One reader per format serves both a unary response (`parse`, the whole text) and a
stream (`feed` each piece, then `finish`); `parse` is `feed` + `finish`, so the two
cannot disagree. Pieces may be split anywhere, even inside a tag or an escape sequence,
and the result does not depend on where.

How text becomes calls:

* Text that might be the start of a marker (a trailing "<tool_c") is held back until
  the next piece tells. Content outside calls passes through unchanged, except that a
  whitespace-only stretch bordering a call (the newline between two calls, or after the
  last one) is dropped: it only separates calls, and would otherwise turn into a
  message.content of "\\n" next to the tool calls.
* A call is announced (a delta with its id and name) once its name is complete and its
  arguments value has begun. From then on the arguments are streamed as they arrive, as
  the raw JSON text the model wrote (trimmed at both ends), so the streamed fragments
  add up to the unary `arguments` byte for byte. Where the value ends is found by
  bracket matching that respects strings and escapes; nothing is re-serialised.
* A call that turns out malformed before it was announced (no JSON object after the
  marker, no name, a name that is not a string) is not a call: its raw text is given back
  as content, as generated. An announced call cannot be taken back from a stream, so it
  stays a call in both modes: if generation stops inside it (max_tokens), its arguments
  are the text written so far, which is what OpenAI does too (finish_reason "length").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ovtrio.parsing.ids import new_call_id
from ovtrio.parsing.json_scan import CallObject, JsonValue, skip_space


@dataclass
class ToolCallDelta:
    """One piece of an OpenAI streaming tool call."""

    index: int  # position of the call in this message (0, 1, ... for parallel calls)
    id: str | None  # set on the first delta of a call only
    name: str | None  # set on the first delta of a call only
    arguments: str  # a fragment of the arguments JSON text ("" allowed on the first delta)


@dataclass
class ParsedDelta:
    """What one piece of generated text adds to the message."""

    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)
    # Reasoning, for formats that carry it in the same stream (harmony's analysis channel).
    reasoning: str = ""


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # complete JSON text, as the model wrote it


def partial_tag_at_end(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper beginning of `tag`. Those
    characters must be held back: the next piece may complete the tag."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


@dataclass
class _PendingCall:
    """A call being read. `raw` is all its text so far, marker included, given back as
    content if it turns out not to be a call. `index` is set once announced."""

    raw: str
    index: int | None = None
    id: str | None = None
    name: str | None = None
    sent: int = 0  # characters of the arguments text already streamed


State = Callable[[bool], bool]


class ToolCallParser:
    """Base reader: the buffer, content output, call announcement and streaming.

    A format is a set of states: methods taking `final` (no more text will come) that
    read from `self._buf` and return True to run the next state at once, or False when
    they need more text (or, at the end, when everything is read).
    """

    args_keys: tuple[str, ...] = ("arguments", "parameters")
    requires_args = False  # a call object without an arguments key is a call with {}
    # Tags the format writes. Where the tokenizer makes them special tokens, the server
    # keeps those tokens in the decoded text, which otherwise skips special tokens.
    MARKERS: tuple[str, ...] = ()
    # The format carries the whole reply (harmony's channels: reasoning and answer too),
    # so the reply is read by it even when the request has no tools.
    CHANNELS = False

    @classmethod
    def for_request(cls, schemas: dict[str, Any]) -> Callable[[], ToolCallParser]:
        """A maker of readers for one request, whose tools have these parameter schemas
        (by function name; empty: calls are not to be read, for formats with CHANNELS)."""
        return cls

    def __init__(self) -> None:
        self._buf = ""  # text received and not yet read
        self._state: State = self._initial_state()
        self._then: State = self._state  # where to go once the pending call is closed
        self._fallback: State = self._state  # ... or given back as content
        self._content: list[str] = []  # output since the last feed/finish returned
        self._reasoning: list[str] = []
        self._deltas: list[ToolCallDelta] = []
        self._calls: list[ToolCall] = []
        self._call: _PendingCall | None = None
        self._object: CallObject | None = None
        self._held_space: list[str] = []  # whitespace at the start of a content stretch, in pieces
        self._stretch_has_text = False
        self._blank: dict[int, str] = {}  # see _space_end

    # Public interface

    def feed(self, text: str) -> ParsedDelta:
        """The next piece of generated text, split anywhere."""
        self._buf += text
        self._run(final=False)
        return self._take()

    def finish(self) -> ParsedDelta:
        """End of generation: resolve what was held back."""
        self._run(final=True)
        if not self._calls:  # no call to separate from: the whitespace is content
            self._content += self._held_space
        self._held_space = []
        return self._take()

    @property
    def calls(self) -> list[ToolCall]:
        """All calls completed so far, in order."""
        return list(self._calls)

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """The whole text at once, for unary responses: (content, calls)."""
        first, last = self.feed(text), self.finish()
        return first.content + last.content, self.calls

    # For subclasses

    def _initial_state(self) -> State:
        raise NotImplementedError

    def _new_id(self) -> str:
        return new_call_id()

    def _run(self, final: bool) -> None:
        while self._state(final):
            self._blank.clear()

    def _take(self) -> ParsedDelta:
        delta = ParsedDelta("".join(self._content), self._deltas, "".join(self._reasoning))
        self._content, self._deltas, self._reasoning = [], [], []
        return delta

    # Content

    def _emit_content(self, text: str) -> None:
        """Content as generated, except a stretch's leading whitespace waits: if a call
        or the end comes before any text, that whitespace only separated calls."""
        if self._stretch_has_text:
            self._content.append(text)
            return
        self._held_space.append(text)  # pieces: a long run of whitespace is not copied again
        if text.strip():  # what was held is whitespace: only the new text can end it
            self._content += self._held_space
            self._held_space, self._stretch_has_text = [], True

    def _space_end(self, start: int = 0) -> int:
        """`skip_space(self._buf, start)`, for states that wait while the buffer holds only
        whitespace there (after a call, before a list): such a state runs again on the
        same buffer with more text after it, so the whitespace it has seen is remembered
        and not read again (a reply of endless newlines would take quadratic time). What
        is remembered is the text itself, so it holds whatever the buffer went through
        since; it is forgotten when a state moves on."""
        seen = self._blank.get(start, "")
        end = skip_space(self._buf, len(seen) if len(seen) > start and self._buf.startswith(seen) else start)
        self._blank[start] = self._buf[:end]
        return end

    def _pass_content_until(self, marker: str, final: bool) -> bool:
        """Content state for formats whose calls begin with `marker`: emit the text
        before it (holding back a possible partial marker) and open a call at it."""
        return self._pass_content_until_any((marker,), final) is not None

    def _pass_content_until_any(self, markers: tuple[str, ...], final: bool) -> str | None:
        """`_pass_content_until` for formats whose calls begin with one of several
        markers: the one found first (a call is open at it), or None (more text needed)."""
        found = [(at, marker) for marker in markers if (at := self._buf.find(marker)) >= 0]
        if not found:
            keep = 0 if final else max(partial_tag_at_end(self._buf, marker) for marker in markers)
            self._emit_content(self._buf[: len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep :]
            return None
        at, marker = min(found)
        self._emit_content(self._buf[:at])
        self._buf = self._buf[at + len(marker) :]
        self._open_call(marker)
        return marker

    # Calls

    def _open_call(self, marker: str) -> None:
        """A call may start here; whitespace-only content just before it separated it."""
        self._call = _PendingCall(raw="".join(self._held_space) + marker)
        self._held_space, self._stretch_has_text = [], False

    def _take_into_call(self, count: int) -> None:
        """Move `count` characters of the buffer into the pending call's raw text."""
        assert self._call is not None  # the states that read a call run while one is open
        self._call.raw += self._buf[:count]
        self._buf = self._buf[count:]

    def _take_space_into_call(self) -> None:
        self._take_into_call(skip_space(self._buf))

    def _stream_call(self, name: str | None, args: JsonValue | None) -> None:
        """Announce the pending call once its name is complete and its arguments have
        begun, then stream whatever arguments text is new."""
        call = self._call
        assert call is not None
        if call.index is None:
            if name is None or args is None:
                return
            self._announce(name)
        if args is not None:
            self._send_arguments(args.text[call.sent : args.trimmed_len])

    def _announce(self, name: str) -> None:
        call = self._call
        assert call is not None
        index, call_id = len(self._calls), self._new_id()
        call.index, call.id, call.name = index, call_id, name
        self._deltas.append(ToolCallDelta(index, call_id, name, ""))

    def _send_arguments(self, piece: str) -> None:
        """Stream arguments text, merged into this output's last delta of the same call."""
        if not piece:
            return
        call = self._call
        assert call is not None and call.index is not None  # arguments follow the announcement
        call.sent += len(piece)
        if self._deltas and self._deltas[-1].index == call.index:
            self._deltas[-1].arguments += piece
        else:
            self._deltas.append(ToolCallDelta(call.index, None, None, piece))

    def _close_call(self, name: str | None, args: JsonValue | None) -> None:
        """The pending call is complete (or cut short after it was announced)."""
        call = self._call
        assert call is not None
        if call.index is None:
            assert name is not None  # a call not yet announced closes only once complete
            self._announce(name)
        self._finish_call(args.trimmed if args is not None else "{}")

    def _finish_call(self, arguments: str) -> None:
        """The announced pending call ends with `arguments`, whose streamed part is a
        prefix of it: the rest is streamed, and the call is complete."""
        call = self._call
        assert call is not None and call.id is not None and call.name is not None  # announced
        self._send_arguments(arguments[call.sent :])
        self._calls.append(ToolCall(call.id, call.name, arguments))
        self._call = None

    def _give_back_call(self) -> None:
        """Not a call after all: its raw text is content, as generated."""
        assert self._call is not None
        raw, self._call = self._call.raw, None
        self._emit_content(raw)

    def _takes_name(self, name: str) -> bool:
        """Whether an object naming this function is a call (the formats that find calls
        in prose take only the request's tools)."""
        return True

    def _drop_call(self) -> None:
        """An empty call list ("[TOOL_CALLS][]"): nothing to keep, nothing to show."""
        self._call = None

    # States shared by the formats

    def _plain(self, final: bool) -> bool:
        """Content to the end (for formats that decide once, at the start)."""
        self._emit_content(self._buf)
        self._buf = ""
        return False

    def _before_object(self, final: bool) -> bool:
        """After a call marker: only whitespace may come before the object's "{"."""
        self._take_space_into_call()
        if not self._buf and not final:
            return False
        if self._buf.startswith("{"):
            self._object = CallObject(self.args_keys)
            self._state = self._in_object
        else:
            self._give_back_call()
            self._state = self._fallback
        return True

    def _in_object(self, final: bool) -> bool:
        """Inside a call object: stream it, and decide at its end whether it was a call."""
        obj, call = self._object, self._call
        assert obj is not None and call is not None
        self._take_into_call(obj.consume(self._buf))
        # A name the reader does not take: the object is read to its end all the same
        # (however the text is split, the same text is given back).
        allowed = obj.name is None or self._takes_name(obj.name)
        if allowed:
            self._stream_call(obj.name, obj.args)
        if not (obj.done or obj.failed or final):
            return False
        complete = obj.done and obj.name is not None and allowed and (obj.args is not None or not self.requires_args)
        if call.index is not None or complete:
            self._close_call(obj.name, obj.args)
            self._state = self._then
        else:
            self._give_back_call()
            self._state = self._fallback
        self._object = None
        return True


# --- The formats ------------------------------------------------------------------------
