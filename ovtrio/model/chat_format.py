"""How the model writes what is not plain answer text, as its chat template teaches it:
the tool-call format, and whether it thinks in <think> tags."""

from __future__ import annotations

import logging

from ovtrio.parsing import PARSERS, THINK_OPEN, ToolCallParser, guess_parser
from ovtrio.settings.server import Settings

log = logging.getLogger("ovtrio")


def tool_parser_for(settings: Settings, chat_template: str) -> type[ToolCallParser] | None:
    """The configured tool-call parser, or the one the chat template's markers suggest.

    A template with no tool support at all gets OpenVINO GenAI's polyfill, which teaches
    the model to reply with a {"tool_calls": [...]} object: that is then the format.
    """
    name: str | None = settings.tool_parser
    if name is None:
        name = guess_parser(chat_template) or (None if "tools" in chat_template else "json_tool_calls")
        if name:
            log.info("tool calls are read in the %s format (from the chat template)", name)
    if name in (None, "none"):
        return None
    return PARSERS[name]


def thinks(settings: Settings, chat_template: str) -> bool:
    """Whether replies start with reasoning in <think> tags, to be kept out of content."""
    if settings.reasoning_parser is not None:
        return settings.reasoning_parser == "think"
    return THINK_OPEN in chat_template
