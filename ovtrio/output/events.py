"""The typed events of a request's output, as every writer reads them.

A choice's events come in the order the text was generated: reasoning, content and
tool-call events, then one ChoiceFinished. The request ends with the scheduler's own
Completed (token usage) or Failed, passed through unchanged.

Events are made for every chunk of every stream, between engine steps, so they are
plain slotted dataclasses: frozen ones are markedly slower to build (see
docs/benchmarks.md#output-events). Nobody changes one once made.
"""

from __future__ import annotations

from dataclasses import dataclass

from ovtrio.scheduler import Completed, Failed


@dataclass(slots=True)
class TopLogprob:
    """One of the most likely tokens at a position: its id, bytes, text (the bytes as
    UTF-8, or `bytes:\\xNN...` for bytes that are not whole UTF-8 characters, so no two
    tokens share a text) and log-probability."""

    token_id: int
    token: bytes
    text: str
    logprob: float


@dataclass(slots=True)
class TokenLogprob:
    """One generated (or prompt) token and its log-probability. `token` is the bytes it
    added to the choice's text (none for a special token the text leaves out); `text` is
    the text it added: empty for a token that ends inside a UTF-8 character, whose
    character the token completing it carries. So a choice's entries join to exactly its
    text. A prompt's first token has no log-probability (None): nothing precedes it.
    `token_id` is the vocabulary id (vLLM's prompt_logprobs are keyed by it). `top`, when
    the most likely tokens were asked for and scored, holds them, most likely first;
    `rank` is the token's own (1: the most likely)."""

    token: bytes
    logprob: float | None
    text: str
    token_id: int = -1
    top: list[TopLogprob] | None = None
    rank: int | None = None


@dataclass(slots=True)
class TextDelta:
    """New content text of choice `choice`. `logprobs`, when they were asked for, covers
    every token generated since the previous TextDelta (those that became reasoning or
    tool calls included), so it may come with empty text."""

    choice: int
    text: str
    logprobs: list[TokenLogprob] | None = None


@dataclass(slots=True)
class PromptScored:
    """The prompt of choice `choice`, one entry per prompt token, before any of its
    generated text (only when the prompt's log-probabilities were asked for)."""

    choice: int
    logprobs: list[TokenLogprob]


@dataclass(slots=True)
class ReasoningDelta:
    """New reasoning text (what a thinking model wrote inside <think>…</think>)."""

    choice: int
    text: str


@dataclass(slots=True)
class ToolCallStarted:
    """A tool call begins: its name is complete and its arguments have begun. `call` is
    its position among the choice's calls."""

    choice: int
    call: int
    id: str
    name: str


@dataclass(slots=True)
class ToolCallArguments:
    """The next fragment of a call's arguments, as the raw JSON text the model wrote."""

    choice: int
    call: int
    fragment: str


@dataclass(slots=True)
class ToolCallDone:
    """A call is complete; `arguments` is all its fragments joined."""

    choice: int
    call: int
    id: str
    name: str
    arguments: str


@dataclass(slots=True)
class ChoiceFinished:
    """The choice's last event. `reason` is OpenAI's finish_reason: "stop", "length", or
    "tool_calls" when the choice made calls and was not cut short; `stop`, the stop
    string that ended it, if one did."""

    choice: int
    reason: str
    stop: str | None = None


OutputEvent = (
    PromptScored
    | TextDelta
    | ReasoningDelta
    | ToolCallStarted
    | ToolCallArguments
    | ToolCallDone
    | ChoiceFinished
    | Completed
    | Failed
)
