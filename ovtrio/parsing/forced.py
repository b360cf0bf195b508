"""The reader of forced tool calls (`tool_choice` "required" or a named function).

Constrained decoding holds the model to a JSON array of {"name": ..., "arguments": {...}}
objects (the constraint is built on the request side, ovtrio/api/formats.py); this reads
that array back into OpenAI tool calls as it streams.
"""

from __future__ import annotations

from ovtrio.parsing.ids import new_call_id
from ovtrio.parsing.mistral import MistralToolParser


class ForcedCallsParser(MistralToolParser):
    """Reads the array the forced-call constraint makes the model write, as it is written:
    the same shape as Mistral's `[TOOL_CALLS][...]`, so that parser's array reading
    streams each call (name first, then argument fragments), with OpenAI-style ids."""

    def __init__(self) -> None:
        super().__init__()
        self.feed(self.TAG)  # the output is the array that follows the tag

    def _new_id(self) -> str:
        return new_call_id()
