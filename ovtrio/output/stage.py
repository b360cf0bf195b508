"""OutputStage: one request's scheduler outputs in, typed output events out."""

from __future__ import annotations

import codecs
from collections.abc import Callable

from ovtrio.output.events import (
    ChoiceFinished,
    OutputEvent,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallArguments,
    ToolCallDone,
    ToolCallStarted,
)
from ovtrio.parsing import ParsedDelta, ReasoningSplitter, ToolCallParser
from ovtrio.scheduler import Completed, Delta, Failed, RequestOutput

TokenBytes = Callable[[int], bytes]


class _Piece:
    """Deltas of one choice received together, read as one piece of text."""

    __slots__ = ("text", "token_ids", "logprobs")

    def __init__(self) -> None:
        self.text: list[str] = []
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []


class _ChoiceReader:
    """One choice's text through the reasoning splitter, then the tool-call parser."""

    def __init__(
        self,
        index: int,
        splitter: ReasoningSplitter | None,
        parser: ToolCallParser | None,
        token_bytes: TokenBytes | None,
    ) -> None:
        self.index = index
        self._splitter = splitter
        self._parser = parser
        self._token_bytes = token_bytes
        # Token bytes become text as whole UTF-8 characters, across pieces.
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._calls_done = 0

    def read(self, piece: _Piece) -> list[OutputEvent]:
        text = "".join(piece.text)
        reasoning, answer = self._splitter.feed(text) if self._splitter else ("", text)
        logprobs = None
        if self._token_bytes is not None:
            logprobs = []
            for token_id, logprob in zip(piece.token_ids, piece.logprobs):
                token = self._token_bytes(token_id)
                logprobs.append(TokenLogprob(token, logprob, self._utf8.decode(token), token_id))
        events: list[OutputEvent] = [ReasoningDelta(self.index, reasoning)] if reasoning else []
        if self._parser is None:
            if answer or (logprobs is not None and piece.token_ids):
                events.append(TextDelta(self.index, answer, logprobs))
            return events
        return events + self._parsed(self._parser.feed(answer), logprobs if piece.token_ids else None)

    def finish(self, reason: str, stop: str | None) -> list[OutputEvent]:
        """The end of the choice: what the splitter and parser held back, then its finish."""
        reasoning, answer = self._splitter.finish() if self._splitter else ("", "")
        events: list[OutputEvent] = [ReasoningDelta(self.index, reasoning)] if reasoning else []
        if self._parser is None:
            if answer:
                events.append(TextDelta(self.index, answer))
            events.append(ChoiceFinished(self.index, reason, stop))
            return events
        events += self._parsed(self._parser.feed(answer), None)
        events += self._parsed(self._parser.finish(), None)
        # A choice cut short by max_tokens says so even if it had started a call.
        made_calls = bool(self._parser.calls)
        events.append(ChoiceFinished(self.index, "tool_calls" if made_calls and reason == "stop" else reason, stop))
        return events

    def _parsed(self, parsed: ParsedDelta, logprobs: list[TokenLogprob] | None) -> list[OutputEvent]:
        events: list[OutputEvent] = [ReasoningDelta(self.index, parsed.reasoning)] if parsed.reasoning else []
        if parsed.content or logprobs is not None:
            events.append(TextDelta(self.index, parsed.content, logprobs))
        for delta in parsed.tool_calls:
            if delta.id is not None:
                events.append(ToolCallStarted(self.index, delta.index, delta.id, delta.name or ""))
            if delta.arguments:
                events.append(ToolCallArguments(self.index, delta.index, delta.arguments))
        calls = self._parser.calls if self._parser else []
        for call in calls[self._calls_done :]:
            events.append(ToolCallDone(self.index, self._calls_done, call.id, call.name, call.arguments))
            self._calls_done += 1
        return events


class OutputStage:
    """Turns the scheduler outputs of one request into output events, choice by choice.

    `reasoning` and `tool_parser` make a fresh splitter and parser for each choice (None:
    the text is all content). `logprobs` gives the bytes each token adds to the text
    (see PromptBuilder.output_bytes), when the request asked for log-probabilities. Deltas
    of one choice that arrive together (the consumer fell behind) are read as one piece,
    so a slow client gets fewer, larger events.
    """

    def __init__(
        self,
        *,
        reasoning: Callable[[], ReasoningSplitter] | None = None,
        tool_parser: Callable[[], ToolCallParser] | None = None,
        logprobs: TokenBytes | None = None,
    ) -> None:
        self._reasoning = reasoning
        self._tool_parser = tool_parser
        self._token_bytes = logprobs
        self._choices: dict[int, _ChoiceReader] = {}

    def feed(self, outputs: list[RequestOutput]) -> list[OutputEvent]:
        """The events of outputs received together, in order."""
        events: list[OutputEvent] = []
        pending: dict[int, _Piece] = {}
        for output in outputs:
            if isinstance(output, Delta):
                if output.text or output.token_ids:
                    piece = pending.setdefault(output.index, _Piece())
                    piece.text.append(output.text)
                    piece.token_ids.extend(output.token_ids)
                    piece.logprobs.extend(output.logprobs or ())
                if output.finish_reason is not None:
                    self._read(pending, events)
                    events += self._choice(output.index).finish(output.finish_reason, output.stop)
            elif isinstance(output, (Completed, Failed)):
                self._read(pending, events)
                events.append(output)
        self._read(pending, events)
        return events

    def _read(self, pending: dict[int, _Piece], events: list[OutputEvent]) -> None:
        for index, piece in pending.items():
            events += self._choice(index).read(piece)
        pending.clear()

    def _choice(self, index: int) -> _ChoiceReader:
        reader = self._choices.get(index)
        if reader is None:
            reader = self._choices[index] = _ChoiceReader(
                index,
                self._reasoning() if self._reasoning else None,
                self._tool_parser() if self._tool_parser else None,
                self._token_bytes,
            )
        return reader
