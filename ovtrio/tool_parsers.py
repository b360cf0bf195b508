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

import json
import secrets
import string
from dataclasses import dataclass, field
from typing import Callable


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


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # complete JSON text, as the model wrote it


def new_call_id() -> str:
    """OpenAI-style call id: "call_" and 24 random hex digits."""
    return "call_" + secrets.token_hex(12)


def new_mistral_call_id() -> str:
    """Mistral's chat templates reject tool_call_ids that are not 9 alphanumerics, and
    clients send our ids back in the next request, so Mistral calls get that shape."""
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(9))


def partial_tag_at_end(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper beginning of `tag`. Those
    characters must be held back: the next piece may complete the tag."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


def _skip_space(text: str, start: int = 0) -> int:
    """Index of the first non-whitespace character of text at or after start."""
    while start < len(text) and text[start].isspace():
        start += 1
    return start


# --- JSON, read without parsing --------------------------------------------------------

_JSON_SPACE = " \t\n\r"
_VALUE_STARTS = frozenset('{["-0123456789tfn')
# Characters that can continue a bare number or true/false/null. A bare value has no
# closing character, so it ends at the first character that is not one of these.
_SCALAR_CHARS = frozenset("0123456789+-.eE" "truefalsn")


class _JsonValue:
    """The raw text of one JSON value, read piece by piece, and whether it has ended.

    Only brackets, strings and escapes are tracked: enough to find where the value ends
    (a "}" inside a string does not close anything), not a validation. That is on
    purpose: whatever the model wrote is kept verbatim, and judging it is up to the
    caller. The first character given must be a value start (see _VALUE_STARTS).
    """

    def __init__(self) -> None:
        self.text = ""
        self.done = False
        self.trimmed_len = 0  # up to the last non-whitespace character
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._scalar = False

    @property
    def trimmed(self) -> str:
        return self.text[: self.trimmed_len]

    def consume(self, text: str, start: int = 0) -> int:
        """Read the characters of text from start that belong to the value; return how
        many."""
        end = start
        while end < len(text) and not self.done:
            char = text[end]
            if self._scalar and char not in _SCALAR_CHARS:
                self.done = True
                break
            end += 1
            if char not in _JSON_SPACE:
                self.trimmed_len = len(self.text) + end - start
            self._step(char)
        self.text += text[start:end]
        return end - start

    def _step(self, char: str) -> None:
        if self._in_string:
            if self._escaped:
                self._escaped = False
            elif char == "\\":
                self._escaped = True
            elif char == '"':
                self._in_string = False
                self.done = self._depth == 0
        elif char == '"':
            self._in_string = True
        elif char in "{[":
            self._depth += 1
        elif char in "}]":
            self._depth -= 1
            self.done = self._depth <= 0
        elif self._depth == 0:
            self._scalar = True


class _CallObject:
    """One call object, `{"name": "f", "arguments": {...}}`, read piece by piece.

    Keys may come in any order and unknown keys are skipped. `name` is set once its
    string is complete; `args` is the arguments value as soon as it begins (the call can
    be announced and its arguments streamed while the object is still open). The object
    stops at its closing brace (`done`) or at the first character that does not fit
    (`failed`); that character is left unread for the caller to look at.
    """

    def __init__(self, args_keys: tuple[str, ...]) -> None:
        self.args_keys = args_keys
        self.state = "open"
        self.name: str | None = None
        self.args: _JsonValue | None = None
        self._key: str | None = None
        self._token: _JsonValue | None = None  # the key or value being read

    @property
    def done(self) -> bool:
        return self.state == "done"

    @property
    def failed(self) -> bool:
        return self.state == "failed"

    def consume(self, text: str) -> int:
        """Read as much of text as belongs to the object; return how many characters."""
        pos = 0
        while pos < len(text) and self.state not in ("done", "failed"):
            if self.state in ("key", "value"):
                pos += self._token.consume(text, pos)
                if self._token.done:
                    self._end_token()
            else:
                pos += self._structural(text[pos])
        return pos

    def _structural(self, char: str) -> int:
        """One character between keys and values; 1 if it was read, 0 if left for a
        token that starts with it, or for the caller if it does not fit."""
        if char in _JSON_SPACE and self.state != "open":
            return 1
        if self.state == "open" and char == "{":
            self.state = "key_or_end"
        elif self.state == "key_or_end" and char == '"':
            self._token, self.state = _JsonValue(), "key"
            return 0
        elif self.state in ("key_or_end", "after_value") and char == "}":
            self.state = "done"  # after a comma too: a trailing comma is forgiven
        elif self.state == "colon" and char == ":":
            self.state = "value_start"
        elif self.state == "value_start" and char in _VALUE_STARTS:
            self._token, self.state = _JsonValue(), "value"
            if self._key in self.args_keys and self.args is None:
                self.args = self._token
            return 0
        elif self.state == "after_value" and char == ",":
            self.state = "key_or_end"
        else:
            self.state = "failed"
            return 0
        return 1

    def _end_token(self) -> None:
        if self.state == "key":
            try:
                self._key = json.loads(self._token.text)
            except ValueError:  # a bad escape in the key
                self.state = "failed"
                return
            self.state = "colon"
            return
        if self._key == "name" and self.name is None:
            try:
                name = json.loads(self._token.text)
            except ValueError:
                name = None
            if not isinstance(name, str) or not name:
                self.state = "failed"
                return
            self.name = name
        self.state = "after_value"


# --- The reader's machinery, shared by every format -------------------------------------


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

    def __init__(self) -> None:
        self._buf = ""  # text received and not yet read
        self._state: State = self._initial_state()
        self._then: State = self._state  # where to go once the pending call is closed
        self._fallback: State = self._state  # ... or given back as content
        self._content: list[str] = []  # output since the last feed/finish returned
        self._deltas: list[ToolCallDelta] = []
        self._calls: list[ToolCall] = []
        self._call: _PendingCall | None = None
        self._object: _CallObject | None = None
        self._held_space = ""  # whitespace at the start of a content stretch
        self._stretch_has_text = False

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
            self._content.append(self._held_space)
        self._held_space = ""
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
            pass

    def _take(self) -> ParsedDelta:
        delta = ParsedDelta("".join(self._content), self._deltas)
        self._content, self._deltas = [], []
        return delta

    # Content

    def _emit_content(self, text: str) -> None:
        """Content as generated, except a stretch's leading whitespace waits: if a call
        or the end comes before any text, that whitespace only separated calls."""
        if self._stretch_has_text:
            self._content.append(text)
            return
        self._held_space += text
        if self._held_space.strip():
            self._content.append(self._held_space)
            self._held_space, self._stretch_has_text = "", True

    def _pass_content_until(self, marker: str, final: bool) -> bool:
        """Content state for formats whose calls begin with `marker`: emit the text
        before it (holding back a possible partial marker) and open a call at it."""
        at = self._buf.find(marker)
        if at < 0:
            keep = 0 if final else partial_tag_at_end(self._buf, marker)
            self._emit_content(self._buf[: len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep :]
            return False
        self._emit_content(self._buf[:at])
        self._buf = self._buf[at + len(marker) :]
        self._open_call(marker)
        return True

    # Calls

    def _open_call(self, marker: str) -> None:
        """A call may start here; whitespace-only content just before it separated it."""
        self._call = _PendingCall(raw=self._held_space + marker)
        self._held_space, self._stretch_has_text = "", False

    def _take_into_call(self, count: int) -> None:
        """Move `count` characters of the buffer into the pending call's raw text."""
        self._call.raw += self._buf[:count]
        self._buf = self._buf[count:]

    def _take_space_into_call(self) -> None:
        self._take_into_call(_skip_space(self._buf))

    def _stream_call(self, name: str | None, args: _JsonValue | None) -> None:
        """Announce the pending call once its name is complete and its arguments have
        begun, then stream whatever arguments text is new."""
        call = self._call
        if call.index is None:
            if name is None or args is None:
                return
            self._announce(name)
        if args is not None:
            self._send_arguments(args.text[call.sent : args.trimmed_len])

    def _announce(self, name: str) -> None:
        call = self._call
        call.index, call.id, call.name = len(self._calls), self._new_id(), name
        self._deltas.append(ToolCallDelta(call.index, call.id, name, ""))

    def _send_arguments(self, piece: str) -> None:
        """Stream arguments text, merged into this output's last delta of the same call."""
        if not piece:
            return
        call = self._call
        call.sent += len(piece)
        if self._deltas and self._deltas[-1].index == call.index:
            self._deltas[-1].arguments += piece
        else:
            self._deltas.append(ToolCallDelta(call.index, None, None, piece))

    def _close_call(self, name: str, args: _JsonValue | None) -> None:
        """The pending call is complete (or cut short after it was announced)."""
        if self._call.index is None:
            self._announce(name)
        arguments = args.trimmed if args is not None else "{}"
        self._send_arguments(arguments[self._call.sent :])
        self._calls.append(ToolCall(self._call.id, self._call.name, arguments))
        self._call = None

    def _give_back_call(self) -> None:
        """Not a call after all: its raw text is content, as generated."""
        raw, self._call = self._call.raw, None
        self._emit_content(raw)

    def _drop_call(self) -> None:
        """An empty call list ("[TOOL_CALLS][]"): nothing to keep, nothing to show."""
        self._call = None

    # States shared by the formats

    def _before_object(self, final: bool) -> bool:
        """After a call marker: only whitespace may come before the object's "{"."""
        self._take_space_into_call()
        if not self._buf and not final:
            return False
        if self._buf.startswith("{"):
            self._object = _CallObject(self.args_keys)
            self._state = self._in_object
        else:
            self._give_back_call()
            self._state = self._fallback
        return True

    def _in_object(self, final: bool) -> bool:
        """Inside a call object: stream it, and decide at its end whether it was a call."""
        obj = self._object
        self._take_into_call(obj.consume(self._buf))
        self._stream_call(obj.name, obj.args)
        if not (obj.done or obj.failed or final):
            return False
        complete = obj.done and obj.name is not None and (obj.args is not None or not self.requires_args)
        if self._call.index is not None or complete:
            self._close_call(obj.name, obj.args)
            self._state = self._then
        else:
            self._give_back_call()
            self._state = self._fallback
        self._object = None
        return True


# --- The formats ------------------------------------------------------------------------


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
        rest = self._buf[_skip_space(self._buf) :]
        if rest.startswith(self.CLOSE):
            self._buf = rest[len(self.CLOSE) :]
        elif not final and self.CLOSE.startswith(rest):
            return False  # "" or a partial close tag: wait
        self._state = self._in_content
        return True


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
        pos = _skip_space(buf)
        if buf.startswith(self.PYTHON_TAG, pos):
            pos = _skip_space(buf, pos + len(self.PYTHON_TAG))
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
        pos = _skip_space(self._buf)
        if self._buf.startswith(";", pos):
            after = _skip_space(self._buf, pos + 1)
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

    def _plain(self, final: bool) -> bool:
        """Content to the end."""
        self._emit_content(self._buf)
        self._buf = ""
        return False


class MistralToolParser(ToolCallParser):
    """Mistral tool calling, `[TOOL_CALLS]` followed by either

        [{"name": "f", "arguments": {...}}, ...]       (Mistral 7B v0.3, Nemo)
        f[ARGS]{...}                                   (tokenizer v11+: Small 3.1+)

    In the newer form each call has its own [TOOL_CALLS]; "[ARGS]" may be absent when
    special tokens are not rendered. A single object without the array is accepted too.
    The [CALL_ID] variant is not read (it becomes content).

    Mistral's templates require 9-character alphanumeric call ids, so ids have that shape.
    """

    TAG = "[TOOL_CALLS]"
    ARGS = "[ARGS]"
    MARKERS = (TAG, ARGS)
    _NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_-.")
    _MAX_NAME = 64  # OpenAI's limit; longer is not a function name

    def __init__(self) -> None:
        super().__init__()
        self._name = ""
        self._args: _JsonValue | None = None

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
        pos = _skip_space(self._buf)
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
        if self._buf.startswith(self.ARGS):
            self._take_into_call(len(self.ARGS))
        elif not final and self.ARGS.startswith(self._buf):
            return False  # "" or a partial [ARGS]: wait
        elif not self._buf.startswith("{"):
            self._give_back_call()
            self._state = self._in_content
            return True
        self._state = self._before_args
        return True

    def _before_args(self, final: bool) -> bool:
        self._take_space_into_call()
        if not self._buf and not final:
            return False
        if self._buf and self._buf[0] in _VALUE_STARTS:
            self._args = _JsonValue()
            self._state = self._in_args
        else:
            self._give_back_call()
            self._state = self._in_content
        return True

    def _in_args(self, final: bool) -> bool:
        """The newer form's arguments: a bare JSON value, streamed as it comes."""
        self._take_into_call(self._args.consume(self._buf))
        self._stream_call(self._name, self._args)
        if not (self._args.done or final):
            return False
        self._close_call(self._name, self._args)
        self._args = None
        self._state = self._in_content
        return True


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
        self._token: _JsonValue | None = None  # the outer key or value being read
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
        pos = _skip_space(self._buf)
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
            self._token, self._state = _JsonValue(), self._in_key
            return True
        if char == "}" and self._array_done:  # after a comma too: forgiven
            return self._end_reply()
        return self._stop(not char)

    def _in_key(self, final: bool) -> bool:
        token = self._token
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
        elif char and char in _VALUE_STARTS:
            self._token, self._state = _JsonValue(), self._in_value
        else:
            return self._stop(not char)
        return True

    def _in_value(self, final: bool) -> bool:
        token = self._token
        self._take_into_call(token.consume(self._buf))
        if not token.done:
            return self._stop(False) if final else False
        if self._key == "content" and not self._content_seen:
            self._content_seen = True
            try:
                text = json.loads(token.text)
            except ValueError:
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
        if _skip_space(self._buf) == len(self._buf):
            if final:
                self._buf = ""
            return False
        self._state = self._plain
        return True

    def _plain(self, final: bool) -> bool:
        """Content to the end."""
        self._emit_content(self._buf)
        self._buf = ""
        return False


PARSERS: dict[str, type[ToolCallParser]] = {
    "hermes": HermesToolParser,
    "qwen": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
    "json_tool_calls": JsonToolCallsParser,
}


def guess_parser(chat_template: str) -> str | None:
    """The tool-call format a chat template teaches its model, by the markers it writes
    (a template renders past calls the way the model is expected to make them)."""
    if "<tool_call>" in chat_template:
        return "hermes"
    if "[TOOL_CALLS]" in chat_template:
        return "mistral"
    if "<|python_tag|>" in chat_template or "ipython" in chat_template:
        return "llama3_json"
    return None
