"""Reading generated text: reasoning apart from the answer (reasoning.py), and tool calls
in each model family's format (one file per format, on the shared reader in
tool_calls.py and the JSON scanner in json_scan.py), plus the reader of forced calls.

Every reader works incrementally (`feed` pieces split anywhere, then `finish`) and on
the whole text (`parse`), with the same result either way.
"""

from ovtrio.parsing.forced import ForcedCallsParser
from ovtrio.parsing.hermes import HermesToolParser
from ovtrio.parsing.json_tool_calls import JsonToolCallsParser
from ovtrio.parsing.llama3_json import Llama3JsonToolParser
from ovtrio.parsing.mistral import MistralToolParser
from ovtrio.parsing.reasoning import THINK_CLOSE, THINK_OPEN, ReasoningSplitter
from ovtrio.parsing.tool_calls import ParsedDelta, ToolCall, ToolCallDelta, ToolCallParser

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


__all__ = [
    "PARSERS",
    "THINK_CLOSE",
    "THINK_OPEN",
    "ForcedCallsParser",
    "HermesToolParser",
    "JsonToolCallsParser",
    "Llama3JsonToolParser",
    "MistralToolParser",
    "ParsedDelta",
    "ReasoningSplitter",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallParser",
    "guess_parser",
]
