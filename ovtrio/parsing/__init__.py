"""Reading generated text: reasoning apart from the answer (reasoning.py), and tool calls
in each model family's format (one file per format, on the shared reader in
tool_calls.py and the JSON scanner in json_scan.py), plus the reader of forced calls.

Every reader works incrementally (`feed` pieces split anywhere, then `finish`) and on
the whole text (`parse`), with the same result either way.
"""

from ovtrio.parsing.forced import ForcedCallsParser
from ovtrio.parsing.harmony import HarmonyParser
from ovtrio.parsing.hermes import HermesToolParser
from ovtrio.parsing.json_tool_calls import JsonToolCallsParser
from ovtrio.parsing.llama3_json import Llama3JsonToolParser
from ovtrio.parsing.mistral import MistralToolParser
from ovtrio.parsing.phi4_mini import Phi4MiniToolParser
from ovtrio.parsing.pythonic import PythonicToolParser
from ovtrio.parsing.qwen3_coder import Qwen3CoderToolParser
from ovtrio.parsing.reasoning import THINK_CLOSE, THINK_OPEN, ReasoningSplitter
from ovtrio.parsing.tool_calls import ParsedDelta, ToolCall, ToolCallDelta, ToolCallParser

PARSERS: dict[str, type[ToolCallParser]] = {
    "hermes": HermesToolParser,
    "qwen": HermesToolParser,
    "qwen3_coder": Qwen3CoderToolParser,
    "llama3_json": Llama3JsonToolParser,
    "pythonic": PythonicToolParser,
    "mistral": MistralToolParser,
    "phi4_mini": Phi4MiniToolParser,
    "harmony": HarmonyParser,
    "json_tool_calls": JsonToolCallsParser,
}
# The names vLLM and OVMS give the same formats, accepted too.
ALIASES = {
    "qwen3coder": "qwen3_coder",  # OVMS
    "qwen3_xml": "qwen3_coder",  # vLLM
    "llama4_pythonic": "pythonic",  # vLLM
    "phi4": "phi4_mini",  # OVMS
    "phi4_mini_json": "phi4_mini",  # vLLM
    "gptoss": "harmony",  # OVMS
    "openai": "harmony",  # vLLM
}
PARSERS.update({alias: PARSERS[name] for alias, name in ALIASES.items()})

# What a chat template writes when it teaches its model a format (a template renders past
# calls the way the model is expected to make them, or spells the format out in the
# instructions it gives), in the order they are looked for: a Qwen3-Coder template has
# <tool_call> too, and Llama 4's pythonic one names the "ipython" role.
TEMPLATE_MARKERS: tuple[tuple[str, str], ...] = (
    ("<|channel|>", "harmony"),
    ("<function=", "qwen3_coder"),
    ("<tool_call>", "hermes"),
    ("<|tool_call|>", "phi4_mini"),
    ("<|tool|>", "phi4_mini"),  # Phi-4-mini's own template: tools in the system message
    ("functools[", "phi4_mini"),
    ("[TOOL_CALLS]", "mistral"),
    ("[func_name1(", "pythonic"),
    ("<|python_tag|>", "llama3_json"),
    ("ipython", "llama3_json"),
)


def guess_format(chat_template: str) -> tuple[str, str] | None:
    """The tool-call format a chat template teaches its model, and the marker that
    shows it."""
    for marker, name in TEMPLATE_MARKERS:
        if marker in chat_template:
            return name, marker
    return None


def guess_parser(chat_template: str) -> str | None:
    """The tool-call format a chat template teaches its model, by the markers it writes."""
    guess = guess_format(chat_template)
    return guess[0] if guess else None


__all__ = [
    "ALIASES",
    "PARSERS",
    "THINK_CLOSE",
    "THINK_OPEN",
    "ForcedCallsParser",
    "HarmonyParser",
    "HermesToolParser",
    "JsonToolCallsParser",
    "Llama3JsonToolParser",
    "MistralToolParser",
    "Phi4MiniToolParser",
    "PythonicToolParser",
    "Qwen3CoderToolParser",
    "ParsedDelta",
    "ReasoningSplitter",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallParser",
    "guess_format",
    "guess_parser",
]
