"""One choice's output events as a sequence of blocks, for the two writers whose objects
are such a sequence: the Responses API's output items (reasoning, message,
function_call) and the Messages API's content blocks (thinking, text, tool_use).

Both follow one rule, kept here: reasoning and content text each go to a block of their
kind, a new one whenever the text changes kind (which closes the open block); each tool
call is a block of its own, opened when the call starts, grown by its argument fragments
and closed when it is done (or when something else opens). BlockWriter decides when a
block opens, grows and closes; a writer says what its blocks and events look like, and
how its reply ends.
"""

from __future__ import annotations

from typing import Generic, Literal, TypeVar

from ovtrio.output import (
    ChoiceFinished,
    OutputEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallArguments,
    ToolCallDone,
    ToolCallStarted,
)
from ovtrio.scheduler import Completed, Failed

Kind = Literal["reasoning", "text", "call"]
Block = TypeVar("Block")
Event = TypeVar("Event")


class BlockWriter(Generic[Block, Event]):
    """Writes the events of one choice (the caller routes a request's choices)."""

    def __init__(self) -> None:
        self.open: Block | None = None  # the block being written
        self.open_kind: Kind | None = None
        self._calls: dict[int, Block] = {}  # a call's position in the choice -> its block

    def write(self, events: list[OutputEvent]) -> list[Event]:
        written: list[Event] = []
        for event in events:
            if isinstance(event, ReasoningDelta):
                if event.text:
                    written += self.text("reasoning", event.text)
            elif isinstance(event, TextDelta):
                written += self.content(event)
            elif isinstance(event, ToolCallStarted):
                written += self.close()
                block = self._calls[event.call] = self.new_block("call", event)
                written += self._opened(block, "call")
            elif isinstance(event, ToolCallArguments):
                growing = self._calls.get(event.call)
                if growing is not None and event.fragment:
                    written += self.grown(growing, "call", event.fragment)
            elif isinstance(event, ToolCallDone):
                if self.open is not None and self.open is self._calls.get(event.call):
                    written += self.close()
            elif isinstance(event, ChoiceFinished):
                written += self.choice_finished(event)
            elif isinstance(event, Completed):
                written += self.request_completed(event)
            elif isinstance(event, Failed):
                written += self.request_failed(event)
        return written

    def text(self, kind: Kind, text: str) -> list[Event]:
        """`text` added to the open block of `kind`, opened first if need be."""
        events = self.begin(kind) if self.open is None or self.open_kind != kind else []
        assert self.open is not None
        return events + self.grown(self.open, kind, text)

    def begin(self, kind: Kind) -> list[Event]:
        """Close the open block and open a new, empty one of `kind`."""
        return self.close() + self._opened(self.new_block(kind, None), kind)

    def close(self) -> list[Event]:
        """The closing events of the open block (none if none is open)."""
        block, kind = self.open, self.open_kind
        if block is None or kind is None:
            return []
        self.open, self.open_kind = None, None
        return self.closed(block, kind)

    def _opened(self, block: Block, kind: Kind) -> list[Event]:
        self.open, self.open_kind = block, kind
        return self.started(block, kind)

    # ---- the writer's -------------------------------------------------------------------

    def content(self, delta: TextDelta) -> list[Event]:
        """A content TextDelta: its text, by default (its log-probabilities, if any, are
        the writer's to place)."""
        return self.text("text", delta.text) if delta.text else []

    def new_block(self, kind: Kind, call: ToolCallStarted | None) -> Block:
        """A new, empty block of `kind` (of `call`, for a call), added to the reply."""
        raise NotImplementedError

    def started(self, block: Block, kind: Kind) -> list[Event]:
        """The events announcing a new block."""
        raise NotImplementedError

    def grown(self, block: Block, kind: Kind, text: str) -> list[Event]:
        """Text (or a call's arguments fragment) added to `block`: its events."""
        raise NotImplementedError

    def closed(self, block: Block, kind: Kind) -> list[Event]:
        """`block` is complete: it takes its final form; the events saying so."""
        raise NotImplementedError

    def choice_finished(self, finished: ChoiceFinished) -> list[Event]:
        """The choice is over (`finished.reason`: OpenAI's finish_reason)."""
        return self.close()

    def request_completed(self, done: Completed) -> list[Event]:
        raise NotImplementedError

    def request_failed(self, failed: Failed) -> list[Event]:
        raise NotImplementedError
