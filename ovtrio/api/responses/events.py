"""The Responses API's output, laid out once for a stream and a unary response alike:
output events in, output items and `response.*` events out, in the order OpenAI and
OVMS document, each with a strictly increasing sequence_number.

    response.created, response.in_progress,
    [reasoning item: output_item.added, reasoning_summary_part.added,
     reasoning_summary_text.delta*, .done, reasoning_summary_part.done, output_item.done]
    [message item: output_item.added, content_part.added, output_text.delta*,
     output_text.done, content_part.done, output_item.done]
    [function_call item: output_item.added, function_call_arguments.delta*, .done,
     output_item.done]*
    response.completed | response.incomplete | response.failed

The same events go out over SSE and the WebSocket; a unary response is the Response the
events end with (its events unsent), so the two cannot disagree.

Log-probabilities go with the message item's text. A TextDelta's cover every token
generated since the previous one, including those that became reasoning or tool calls,
so they may come with no text: while the message item is open they go out at once (an
output_text.delta with empty text, as chat sends a chunk with empty content); before it
opens they wait for its first delta. A choice that made neither text nor a tool call
still answers with an (empty) message item, which holds its log-probabilities; those
that arrive after its last message item (a tool call's tokens), and those of a reply
that only called tools, belong to no output text and are left out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from ovtrio.api.blocks import BlockWriter, Kind
from ovtrio.api.errors import api_error
from ovtrio.api.responses.body import Response
from ovtrio.api.responses.objects import (
    ArgumentsDelta,
    ArgumentsDone,
    ContentPartEvent,
    FunctionCallItem,
    LogProb,
    MessageItem,
    OutputItem,
    OutputItemEvent,
    OutputText,
    OutputTextDelta,
    OutputTextDone,
    ReasoningItem,
    ResponseStateEvent,
    StreamEvent,
    SummaryPartEvent,
    SummaryText,
    SummaryTextDelta,
    SummaryTextDone,
    log_probs,
    snapshot,
)
from ovtrio.output import (
    ChoiceFinished,
    Outcome,
    OutputEvent,
    ResultCollector,
    TextDelta,
    ToolCallStarted,
)
from ovtrio.parsing.ids import new_id
from ovtrio.scheduler import Completed, Failed

# envelope(status, output, usage, incomplete, error): body.response_envelope with the
# request's part bound.
Envelope = Callable[..., Response]


def message_status(finish_reason: str) -> Literal["completed", "incomplete"]:
    return "incomplete" if finish_reason == "length" else "completed"


class ChoiceItems(BlockWriter[OutputItem, StreamEvent]):
    """One choice's output items (`items`), and the events that build them. The
    request's end (Completed, Failed) is ResponseEvents' to write."""

    def __init__(self) -> None:
        super().__init__()
        self.items: list[OutputItem] = []
        self._text = ""  # of the open reasoning or message item
        self._logprobs: list[LogProb] = []  # of the open message item
        self._waiting: list[LogProb] = []  # for the message item's next delta
        self.reason = "stop"  # the choice's finish_reason, once it has finished
        self._made_message = False

    def _where(self, item: OutputItem) -> dict[str, Any]:
        index = next(i for i, each in enumerate(self.items) if each is item)
        return {"item_id": item.id, "output_index": index}

    def content(self, delta: TextDelta) -> list[StreamEvent]:
        self._waiting += log_probs(delta.logprobs)
        if delta.text:
            return self.text("text", delta.text)
        if self._waiting and self.open_kind == "text":
            assert self.open is not None
            return self.grown(self.open, "text", "")
        return []

    def new_block(self, kind: Kind, call: ToolCallStarted | None) -> OutputItem:
        item: OutputItem
        if call is not None:
            item = FunctionCallItem(id=new_id("fc_"), call_id=call.id, name=call.name)
        elif kind == "reasoning":
            item = ReasoningItem(id=new_id("rs_"))
        else:
            item = MessageItem(id=new_id("msg_"))
            self._made_message = True
        self.items.append(item)
        return item

    def started(self, item: OutputItem, kind: Kind) -> list[StreamEvent]:
        added = OutputItemEvent(
            type="response.output_item.added", output_index=len(self.items) - 1, item=snapshot(item)
        )
        where = self._where(item)
        if isinstance(item, ReasoningItem):
            return [
                added,
                SummaryPartEvent(type="response.reasoning_summary_part.added", **where, part=SummaryText(text="")),
            ]
        if isinstance(item, MessageItem):
            return [added, ContentPartEvent(type="response.content_part.added", **where, part=OutputText(text=""))]
        return [added]

    def grown(self, item: OutputItem, kind: Kind, text: str) -> list[StreamEvent]:
        where = self._where(item)
        if isinstance(item, FunctionCallItem):
            item.arguments += text
            return [ArgumentsDelta(**where, delta=text)]
        self._text += text
        if isinstance(item, ReasoningItem):
            return [SummaryTextDelta(**where, delta=text)]
        logprobs, self._waiting = self._waiting, []
        self._logprobs += logprobs
        return [OutputTextDelta(**where, delta=text, logprobs=logprobs)]

    def closed(self, item: OutputItem, kind: Kind) -> list[StreamEvent]:
        where = self._where(item)
        events: list[StreamEvent] = []
        if isinstance(item, ReasoningItem):
            summary = SummaryText(text=self._text)
            events.append(SummaryTextDone(**where, text=self._text))
            events.append(SummaryPartEvent(type="response.reasoning_summary_part.done", **where, part=summary))
            item.summary = [summary]
        elif isinstance(item, MessageItem):
            part = OutputText(text=self._text, logprobs=self._logprobs)
            events.append(OutputTextDone(**where, text=self._text, logprobs=self._logprobs))
            events.append(ContentPartEvent(type="response.content_part.done", **where, part=part))
            item.content = [part]
            item.status = message_status(self.reason)
        else:
            events.append(ArgumentsDone(**where, name=item.name, arguments=item.arguments))
            item.status = "completed"
        self._text, self._logprobs = "", []
        done = OutputItemEvent(
            type="response.output_item.done", output_index=where["output_index"], item=snapshot(item)
        )
        return events + [done]

    def choice_finished(self, finished: ChoiceFinished) -> list[StreamEvent]:
        """The choice's items end; one that wrote nothing to show answers empty."""
        self.reason = finished.reason
        events = self.close()
        if not self._made_message and not any(isinstance(item, FunctionCallItem) for item in self.items):
            events += self.begin("text")
            if self._waiting and self.open is not None:
                events += self.grown(self.open, "text", "")
            events += self.close()
        return events


class ResponseEvents:
    """One response's events (`opening`, then `write` as output events arrive). Once
    the request has ended, `final` is the Response and `outcome` its typed aggregate
    (or `failure` says why it failed). A stream has one choice; a unary response's
    items are its choices', in order."""

    def __init__(self, envelope: Envelope, choices: int = 1) -> None:
        self._envelope = envelope
        self._choices = [ChoiceItems() for _ in range(choices)]
        self._results = ResultCollector(choices)
        self._sequence = 0
        self.final: Response | None = None
        self.outcome: Outcome | None = None
        self.failure: Failed | None = None

    @property
    def output(self) -> list[OutputItem]:
        return [item for choice in self._choices for item in choice.items]

    def _numbered(self, events: list[StreamEvent]) -> list[StreamEvent]:
        for event in events:
            event.sequence_number = self._sequence
            self._sequence += 1
        return events

    def opening(self) -> list[StreamEvent]:
        response = self._envelope("in_progress", [], None, False, None)
        return self._numbered(
            [
                ResponseStateEvent(type="response.created", response=response),
                ResponseStateEvent(type="response.in_progress", response=response),
            ]
        )

    def write(self, events: list[OutputEvent]) -> list[StreamEvent]:
        written: list[StreamEvent] = []
        for event in events:
            if isinstance(event, Completed):
                written += self._complete(event)
            elif isinstance(event, Failed):
                written += self._fail(event)
            else:
                written += self._choices[event.choice].write([event])
        ended = self._results.add(events)
        if isinstance(ended, Outcome):
            self.outcome = ended
        return self._numbered(written)

    def _complete(self, usage: Completed) -> list[StreamEvent]:
        events = [event for choice in self._choices for event in choice.close()]
        incomplete = any(choice.reason == "length" for choice in self._choices)
        status = "incomplete" if incomplete else "completed"
        self.final = self._envelope(status, self.output, usage, incomplete, None)
        return events + [ResponseStateEvent(type=f"response.{status}", response=self.final)]

    def _fail(self, failed: Failed) -> list[StreamEvent]:
        self.failure = failed
        events = [event for choice in self._choices for event in choice.close()]
        error = {"code": "server_error", "message": api_error(failed).message}
        response = self._envelope("failed", self.output, None, False, error)
        return events + [ResponseStateEvent(type="response.failed", response=response)]
