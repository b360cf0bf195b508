"""Request bodies of the OpenAI-compatible endpoints, validated with pydantic.

Validation is strict (no "5" for 5, no 1 for true), as OpenAI's API is. Unknown fields
are ignored, so do the fields OpenAI clients routinely send that change nothing here
(`user`, `service_tier`, `store`, ...; `metadata` once checked by OpenAI's rules). An
optional field sent as null takes its default, as OpenAI's nullable fields do. Fields
whose meaning the server cannot honour are refused by name (see UNSUPPORTED).

One module a concept: what every body shares (body.py), `metadata` (metadata.py), the
sampling fields of every generation endpoint (sampling_fields.py), chat messages
(chat_messages.py), tools and reasoning (tools.py), and the bodies of completions and
chat completions (completions.py, chat_completions.py). The Responses and Messages
APIs' bodies, built from these, are in their own packages.
"""

from ovtrio.api.protocol.body import Body
from ovtrio.api.protocol.chat_completions import ChatCompletionRequest
from ovtrio.api.protocol.chat_messages import (
    ChatMessage,
    ContentPart,
    FunctionCall,
    ImagePart,
    ImageURL,
    TextPart,
    ToolCallRef,
)
from ovtrio.api.protocol.completions import CompletionRequest
from ovtrio.api.protocol.metadata import check_metadata
from ovtrio.api.protocol.sampling_fields import (
    UNSUPPORTED,
    SamplingFields,
    StreamOptions,
)
from ovtrio.api.protocol.tools import (
    FunctionSpec,
    NamedFunction,
    NamedToolChoice,
    ReasoningOptions,
    Tool,
    ToolAndReasoningFields,
)

__all__ = [
    "UNSUPPORTED",
    "Body",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "ContentPart",
    "FunctionCall",
    "FunctionSpec",
    "ImagePart",
    "ImageURL",
    "NamedFunction",
    "NamedToolChoice",
    "ReasoningOptions",
    "SamplingFields",
    "StreamOptions",
    "TextPart",
    "Tool",
    "ToolAndReasoningFields",
    "ToolCallRef",
    "check_metadata",
]
