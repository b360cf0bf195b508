"""Request bodies of Anthropic's Messages API (POST /v1/messages and
/v1/messages/count_tokens), validated with pydantic.

Unlike the OpenAI bodies, unknown fields are refused by name: Anthropic's API does the
same, and a field the server does not know is one it would otherwise ignore silently.
The fields that change nothing on a local server (IGNORED_FIELDS, and `cache_control` on
blocks) are accepted and ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ovtrio.api.errors import invalid
from ovtrio.api.messages.errors import THREAD_UNSUPPORTED
from ovtrio.api.protocol.keep_alive import KeepAlive

# Top-level fields accepted and ignored: service tiers, speed modes, effort, prompt-cache
# breakpoints, code-execution containers, where inference runs, cache diagnostics and
# remote MCP servers are Anthropic's own services; the two ids name Anthropic accounts.
IGNORED_FIELDS = (
    "service_tier",
    "speed",
    "cache_control",
    "container",
    "inference_geo",
    "diagnostics",
    "mcp_servers",
    "user_profile_id",
    "workspace_id",
)

# Anthropic takes no more; a stop sequence costs the scheduler a little on every delta.
MAX_STOP_SEQUENCES = 32
# Anthropic's smallest thinking budget.
MIN_THINKING_BUDGET = 1024

TOOL_NAME = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,128}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class _Block(_Strict):
    cache_control: Any = None  # a prompt-cache breakpoint: accepted, ignored


class TextBlock(_Block):
    type: Literal["text"]
    text: str
    citations: list[Any] | None = None  # passed back from an earlier reply: ignored


class ImageSource(_Strict):
    LIFTED_FIELDS: ClassVar[frozenset[str]] = frozenset({"url"})  # a data URL may be lifted (lifted_strings.py)

    type: Literal["base64", "url"]
    media_type: str | None = None  # base64
    data: str | None = None  # base64
    url: str | None = None  # url

    @model_validator(mode="after")
    def _check_source(self) -> ImageSource:
        if self.type == "base64" and not (self.media_type and self.data is not None):
            raise ValueError("a base64 image source needs media_type and data")
        if self.type == "url" and not self.url:
            raise ValueError("a url image source needs url")
        return self

    def as_url(self) -> str:
        """The source as the URL the chat path reads (a data: URL for base64)."""
        if self.type == "base64":
            return f"data:{self.media_type};base64,{self.data}"
        return self.url or ""


class ImageBlock(_Block):
    """An image, for a vision-language model (a text-only model refuses it by name)."""

    type: Literal["image"]
    source: ImageSource


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock] | None = None
    is_error: bool = False

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(block.text for block in self.content if isinstance(block, TextBlock))


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    caller: Any = None  # set by Anthropic's server tools: ignored


class ThinkingBlock(_Block):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Block):
    type: Literal["redacted_thinking"]
    data: str


ContentBlock = Annotated[
    TextBlock | ImageBlock | ToolResultBlock | ToolUseBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]


class InputMessage(_Strict):
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class ToolDefinition(_Strict):
    name: TOOL_NAME
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    strict: bool | None = None
    cache_control: Any = None


class ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(_Strict):
    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: int | None = None
    display: Literal["summarized", "omitted"] | None = None

    @property
    def on(self) -> bool:
        return self.type != "disabled"


class OutputFormat(_Strict):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Strict):
    format: OutputFormat | None = None
    effort: Any = None  # how hard Claude thinks: accepted, ignored


class Metadata(_Strict):
    user_id: str | None = None


class MessagesInput(_Strict):
    """What the prompt is made of: the body of count_tokens, and of a message."""

    model: str
    messages: Annotated[list[InputMessage], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    metadata: Metadata | None = None
    # As chat completions' parse_special (api/protocol/tools.py): an extension.
    parse_special: bool | None = None
    service_tier: Any = None
    speed: Any = None
    cache_control: Any = None
    container: Any = None
    inference_geo: Any = None
    diagnostics: Any = None
    mcp_servers: Any = None
    user_profile_id: Any = None
    workspace_id: Any = None

    # Message threads (the server holding a conversation between turns) are Anthropic's
    # own service: a request that asks for one is refused before anything else, in the
    # shape on which Anthropic's SDKs send the whole conversation again without it
    # (errors.py, THREAD_UNSUPPORTED). `false` asks for none.
    thread: Any = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_thread(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("thread") not in (None, False):
            raise invalid(
                "Message threads are not supported by this server: send the whole conversation without 'thread'.",
                "thread",
                THREAD_UNSUPPORTED,
            )
        return data

    @model_validator(mode="after")
    def _check_input(self) -> MessagesInput:
        for i, message in enumerate(self.messages):
            for j, block in enumerate(message.content if isinstance(message.content, list) else []):
                where = f"messages[{i}].content[{j}]"
                nested = block.content if isinstance(block, ToolResultBlock) and isinstance(block.content, list) else []
                if any(isinstance(b, ImageBlock) for b in nested):
                    raise invalid(
                        f"Invalid value for '{where}': images inside a tool_result are not supported; send them in a"
                        " user message's own image block.",
                        where,
                        "unsupported_input",
                    )
                allowed = _BLOCKS_BY_ROLE[message.role]
                if block.type not in allowed:
                    raise invalid(
                        f"Invalid value for '{where}': a {message.role} message cannot hold a {block.type} block"
                        f" (only {', '.join(allowed)}).",
                        where,
                    )
        names = [tool.name for tool in self.tools or []]
        if len(set(names)) != len(names):
            raise invalid("Invalid value for 'tools': tool names must be unique.", "tools")
        choice = self.tool_choice
        if choice is not None:
            if choice.type == "tool":
                if not choice.name:
                    raise invalid("Missing required parameter: 'tool_choice.name'.", "tool_choice.name")
                if choice.name not in names:
                    raise invalid(
                        f"Invalid value for 'tool_choice.name': '{choice.name}' is not among the tools.",
                        "tool_choice.name",
                    )
            elif choice.name is not None:
                raise invalid("'tool_choice.name' goes only with type 'tool'.", "tool_choice.name")
            if choice.type in ("any", "tool") and not names:
                raise invalid(f"tool_choice '{choice.type}' needs tools.", "tool_choice")
            if choice.type in ("any", "tool") and self.thinking is not None and self.thinking.on:
                # Anthropic's rule too: a forced call is the whole reply, with no room to think.
                raise invalid(
                    "Thinking may not be used when tool_choice forces tool use; use type 'auto' or 'none'.",
                    "tool_choice",
                )
            if choice.type in ("any", "tool") and self.output_format() is not None:
                raise invalid(
                    "output_config.format cannot be combined with a tool_choice that forces tool use.",
                    "output_config.format",
                )
        thinking = self.thinking
        if thinking is not None:
            if thinking.type == "enabled" and thinking.budget_tokens is None:
                raise invalid("Missing required parameter: 'thinking.budget_tokens'.", "thinking.budget_tokens")
            if thinking.type != "enabled" and thinking.budget_tokens is not None:
                raise invalid("'thinking.budget_tokens' goes only with type 'enabled'.", "thinking.budget_tokens")
            if thinking.budget_tokens is not None and thinking.budget_tokens < MIN_THINKING_BUDGET:
                raise invalid(
                    f"Invalid value for 'thinking.budget_tokens': must be at least {MIN_THINKING_BUDGET}.",
                    "thinking.budget_tokens",
                )
        return self

    def output_format(self) -> dict[str, Any] | None:
        """output_config.format's JSON schema, if any."""
        if self.output_config is None or self.output_config.format is None:
            return None
        return self.output_config.format.schema_

    def tool_choice_type(self) -> str:
        """ "auto", "any", "tool" or "none": Anthropic's default is auto."""
        return self.tool_choice.type if self.tool_choice else "auto"


_BLOCKS_BY_ROLE = {
    "user": ("text", "image", "tool_result"),
    "assistant": ("text", "tool_use", "thinking", "redacted_thinking"),
    "system": ("text",),
}


class MessagesRequest(MessagesInput):
    """The body of POST /v1/messages."""

    max_tokens: Annotated[int, Field(ge=1)]
    # Seconds the model stays loaded after this request (Ollama's keep_alive).
    keep_alive: KeepAlive | None = None
    stop_sequences: (
        Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=MAX_STOP_SEQUENCES)] | None
    ) = None
    stream: bool = False
    # No longer in Anthropic's SDK, still sent by older clients and other tools.
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None

    @model_validator(mode="after")
    def _check_budget(self) -> MessagesRequest:
        budget = self.thinking.budget_tokens if self.thinking else None
        if budget is not None and budget >= self.max_tokens:
            raise invalid(
                "Invalid value for 'thinking.budget_tokens': must be less than max_tokens.", "thinking.budget_tokens"
            )
        return self
