"""A unary response is the aggregate of the events a stream would have carried: one
ChoiceResult per choice, built from exactly those events."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ovtrio.output.events import (
    ChoiceFinished,
    OutputEvent,
    PromptScored,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallDone,
)
from ovtrio.parsing import ToolCall
from ovtrio.scheduler import Completed, Failed


@dataclass
class ChoiceResult:
    """Everything one choice produced."""

    text: str = ""  # content
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None  # when asked for: every generated token
    prompt_logprobs: list[TokenLogprob] | None = None  # when asked for: every prompt token
    finish_reason: str = "stop"


@dataclass(frozen=True)
class Outcome:
    """A finished request: its choices in order, and its token usage."""

    choices: list[ChoiceResult]
    usage: Completed


class ResultCollector:
    """Gathers a request's events into ChoiceResults until the request ends."""

    def __init__(self, choices: int) -> None:
        self.choices = [ChoiceResult() for _ in range(choices)]

    def add(self, events: Iterable[OutputEvent]) -> Outcome | Failed | None:
        """Take `events`; the Outcome (or the Failed) once the request has ended."""
        for event in events:
            if isinstance(event, TextDelta):
                result = self.choices[event.choice]
                result.text += event.text
                if event.logprobs is not None:
                    result.logprobs = (result.logprobs or []) + event.logprobs
            elif isinstance(event, PromptScored):
                self.choices[event.choice].prompt_logprobs = event.logprobs
            elif isinstance(event, ReasoningDelta):
                self.choices[event.choice].reasoning += event.text
            elif isinstance(event, ToolCallDone):
                self.choices[event.choice].tool_calls.append(ToolCall(event.id, event.name, event.arguments))
            elif isinstance(event, ChoiceFinished):
                self.choices[event.choice].finish_reason = event.reason
            elif isinstance(event, Completed):
                return Outcome(self.choices, event)
            elif isinstance(event, Failed):
                return event
        return None
