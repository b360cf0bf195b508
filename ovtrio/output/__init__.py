"""Where output becomes typed events: between the scheduler's per-request outputs and
the API's writers.

The scheduler hands each request text deltas per choice (already detokenized and cut at
stop strings). OutputStage (stage.py) runs every choice's text through the reasoning
splitter and the tool-call parser and returns events (events.py): content text with its
token log-probabilities, reasoning text, tool calls started / argument fragments / done,
a choice's finish, and the request's end (usage) or failure. Every response the API
writes, streamed or unary, in any of its shapes, is written from these events; a unary
response is their aggregate (results.py).
"""

from ovtrio.output.events import (
    ChoiceFinished,
    OutputEvent,
    PromptScored,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallArguments,
    ToolCallDone,
    ToolCallStarted,
    TopLogprob,
)
from ovtrio.output.results import ChoiceResult, Outcome, ResultCollector
from ovtrio.output.stage import OutputStage, TokenBytes

__all__ = [
    "ChoiceFinished",
    "ChoiceResult",
    "Outcome",
    "OutputEvent",
    "OutputStage",
    "PromptScored",
    "ReasoningDelta",
    "ResultCollector",
    "TextDelta",
    "TokenBytes",
    "TokenLogprob",
    "TopLogprob",
    "ToolCallArguments",
    "ToolCallDone",
    "ToolCallStarted",
]
