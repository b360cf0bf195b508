"""How the model writes what is not plain answer text, as its chat template teaches it:
the tool-call format, and whether it thinks in <think> tags (or, with harmony, on a
channel of its own)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ovtrio.parsing import PARSERS, THINK_OPEN, HarmonyParser, ToolCallParser, guess_format
from ovtrio.settings.server import Settings

log = logging.getLogger("ovtrio")


@dataclass(frozen=True)
class ChatFormat:
    """The formats a model's replies are read in, and why (for the log and /v1/models)."""

    tool_calls: str | None  # a name of PARSERS; None: tool calls are not read
    reasoning: str | None  # "think", "harmony" or None
    reason: str

    @property
    def tool_parser(self) -> type[ToolCallParser] | None:
        return PARSERS[self.tool_calls] if self.tool_calls else None

    def describe(self) -> dict[str, str | None]:
        return {"tool_calls": self.tool_calls, "reasoning": self.reasoning, "chosen_by": self.reason}


NO_FORMAT = ChatFormat(None, None, "")


def chat_format(settings: Settings, chat_template: str) -> ChatFormat:
    """The configured formats, or those the chat template's markers suggest, logged."""
    name: str | None = settings.tool_parser
    if name is not None:
        reason = "the tool_parser setting"
    else:
        guess = guess_format(chat_template)
        if guess is not None:
            name, marker = guess
            reason = f"the chat template writes {marker}"
        elif "tools" in chat_template:
            reason = "the chat template shows tools in a format not known here"
        else:
            # A template with no tool support at all gets OpenVINO GenAI's polyfill, which
            # teaches the model to reply with a {"tool_calls": [...]} object.
            name, reason = "json_tool_calls", "the chat template has no tools: OpenVINO GenAI's polyfill shows them"
    if name == "none":
        name = None
    if name is not None and PARSERS[name] is HarmonyParser:
        reasoning: str | None = "harmony"
    elif settings.reasoning_parser is not None:
        reasoning = None if settings.reasoning_parser == "none" else "think"
    else:
        reasoning = "think" if THINK_OPEN in chat_template else None
    log.info(
        "tool calls are read in the %s format, reasoning %s (%s)",
        name or "no",
        f"in the {reasoning} format" if reasoning else "not at all",
        reason,
    )
    return ChatFormat(name, reasoning, reason)
