"""The messages of a chat: their roles, text and image parts, and the tool calls of
the history."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, PrivateAttr, model_validator

from ovtrio.api.protocol.body import Body


class TextPart(Body):
    type: Literal["text"]
    text: str


class ImageURL(Body):
    LIFTED_FIELDS: ClassVar[frozenset[str]] = frozenset({"url"})  # a data URL may be lifted (lifted_strings.py)

    url: str
    detail: Literal["auto", "low", "high"] | None = None  # accepted; the model's preprocessor decides


class ImagePart(Body):
    """An image in a message: a data: URL (base64), or an http(s) URL where the server
    fetches them (ovtrio/images)."""

    LIFTED_FIELDS: ClassVar[frozenset[str]] = frozenset({"image_url"})

    type: Literal["image_url"]
    image_url: ImageURL | str
    # The request field that held it, when it came from another shape of request (a
    # Responses input_image): named in errors.
    _source_param: str | None = PrivateAttr(None)

    @property
    def source_param(self) -> str | None:
        return self._source_param

    def held_in(self, param: str) -> ImagePart:
        self._source_param = param
        return self

    @property
    def url(self) -> str:
        return self.image_url if isinstance(self.image_url, str) else self.image_url.url


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class FunctionCall(Body):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCallRef(Body):
    """A tool call in an assistant message of the history."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallRef] | None = None  # assistant
    tool_call_id: str | None = None  # tool

    @model_validator(mode="after")
    def _check_role_fields(self) -> ChatMessage:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content if isinstance(part, TextPart))

    def image_parts(self) -> list[tuple[int, ImagePart]]:
        """The message's images, with their index among its content parts."""
        if not isinstance(self.content, list):
            return []
        return [(i, part) for i, part in enumerate(self.content) if isinstance(part, ImagePart)]
