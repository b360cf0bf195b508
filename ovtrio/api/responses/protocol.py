"""Request body of the Responses API (/v1/responses, /v3/responses), validated with
pydantic, and its translation into the chat pieces the server already has."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from ovtrio.api.errors import invalid
from ovtrio.api.protocol import (
    Body,
    ChatMessage,
    FunctionCall,
    ImagePart,
    ImageURL,
    SamplingFields,
    TextPart,
    ToolAndReasoningFields,
    ToolCallRef,
)


class InputPart(Body):
    LIFTED_FIELDS: ClassVar[frozenset[str]] = frozenset({"image_url"})  # a data URL may be lifted (lifted_strings.py)

    type: Literal["input_text", "output_text", "text", "input_image", "input_file", "refusal"]
    text: str | None = None
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None


class InputItem(Body):
    """One item of `input`: a message (with or without "type": "message"), a past
    function call, a function call's output, or a past reasoning item (as clients such
    as the Agents SDK send back a reply's output; it is not shown to the model again,
    as chat templates leave the reasoning of earlier turns out)."""

    type: Literal["message", "function_call", "function_call_output", "reasoning"] = "message"
    role: Literal["user", "system", "developer", "assistant"] | None = None
    content: str | list[InputPart] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None
    id: str | None = None
    status: str | None = None
    summary: list[dict[str, Any]] | None = None  # a reasoning item's
    encrypted_content: str | None = None  # a reasoning item's (never made here)

    @model_validator(mode="after")
    def _check_kind(self) -> InputItem:
        if self.type == "message" and self.role is None:
            raise ValueError("a message item needs a role")
        if self.type == "function_call" and not (self.call_id and self.name and self.arguments is not None):
            raise ValueError("a function_call item needs call_id, name and arguments")
        if self.type == "function_call_output" and not (self.call_id and self.output is not None):
            raise ValueError("a function_call_output item needs call_id and output")
        return self


class TextOptions(Body):
    format: dict[str, Any] | None = None
    verbosity: str | None = None  # accepted, ignored


IncludeValue = Literal[
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
]


class ResponsesRequest(SamplingFields, ToolAndReasoningFields):
    prompt_field: ClassVar[str] = "input"

    input: str | Annotated[list[InputItem], Field(min_length=1)]
    instructions: str | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    text: TextOptions | None = None
    response_format: dict[str, Any] | None = None
    logprobs: bool = False
    # OpenAI's way to ask for logprobs is include "message.output_text.logprobs"; the
    # other values name items this server never makes, or a field it leaves out
    # (reasoning.encrypted_content: reasoning is returned in the clear).
    include: list[IncludeValue] | None = None
    # Served on chat and completions; here only 0, rather than an empty list in silence.
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    store: bool = True
    previous_response_id: str | None = None

    @model_validator(mode="after")
    def _check_responses(self) -> ResponsesRequest:
        if self.stream and self.n > 1:
            raise invalid("n must be 1 when streaming a response.", "n")
        if self.max_tokens is not None:
            raise invalid("The Responses API names this max_output_tokens.", "max_tokens")
        if self.top_logprobs:
            raise invalid(
                "top_logprobs is not served on the Responses API (chat and completions serve it).",
                "top_logprobs",
                "unsupported_parameter",
            )
        for i, item in enumerate(self.items()):
            for j, part in enumerate(item.content if isinstance(item.content, list) else []):
                if part.type == "input_file":
                    raise invalid(
                        "input_file parts are not supported by this server.",
                        f"input[{i}].content[{j}]",
                        "unsupported_input",
                    )
                if part.type == "input_image" and not part.image_url:
                    raise invalid(
                        "An input_image part needs an image_url (a data: URL); file_id is not supported.",
                        f"input[{i}].content[{j}].image_url",
                        "unsupported_input",
                    )
        return self

    def requested_max_tokens(self) -> tuple[int | None, str]:
        return self.max_output_tokens, "max_output_tokens"

    def wants_logprobs(self) -> bool:
        return self.logprobs or "message.output_text.logprobs" in (self.include or ())

    def items(self) -> list[InputItem]:
        if isinstance(self.input, str):
            return [InputItem(role="user", content=self.input)]
        return list(self.input)

    def chat_messages(self, previous: list[ChatMessage] = ()) -> list[ChatMessage]:  # type: ignore[assignment]
        """The conversation as chat messages: this request's instructions first (as
        OpenAI does, earlier turns' instructions are not carried over), then the earlier
        turns, then this input."""
        system = [ChatMessage(role="system", content=self.instructions)] if self.instructions else []
        return [*system, *previous, *self.input_messages()]

    def input_messages(self) -> list[ChatMessage]:
        """This request's input items as chat messages."""
        messages: list[ChatMessage] = []
        for index, item in enumerate(self.items()):
            if item.type == "reasoning":
                continue
            if item.type == "function_call":
                call = ToolCallRef(
                    id=item.call_id or "", function=FunctionCall(name=item.name or "", arguments=item.arguments or "")
                )
                if messages and messages[-1].role == "assistant" and messages[-1].tool_calls is not None:
                    messages[-1].tool_calls.append(call)
                else:
                    messages.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))
            elif item.type == "function_call_output":
                messages.append(ChatMessage(role="tool", tool_call_id=item.call_id, content=item.output))
            elif isinstance(item.content, list) and any(p.type == "input_image" for p in item.content):
                # Text and images in their order, as chat content parts.
                parts: list[TextPart | ImagePart] = [
                    ImagePart(type="image_url", image_url=ImageURL(url=p.image_url or "")).held_in(
                        f"input[{index}].content[{j}].image_url"
                    )
                    if p.type == "input_image"
                    else TextPart(type="text", text=p.text or "")
                    for j, p in enumerate(item.content)
                ]
                messages.append(ChatMessage(role=item.role or "user", content=parts))
            else:
                text = (
                    item.content if isinstance(item.content, str) else "".join(p.text or "" for p in item.content or [])
                )
                messages.append(ChatMessage(role=item.role or "user", content=text))
        return messages

    def output_format(self) -> dict[str, Any] | None:
        """text.format (OpenAI's name) or response_format (OVMS's); both are accepted.
        A {"type": "text"} format is no format."""
        if self.text and self.text.format is not None:
            return self.text.format
        return self.response_format
