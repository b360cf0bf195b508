"""Tools, tool choice, structured output and reasoning: the fields chat completions and
the Responses API share."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from ovtrio.api.errors import invalid
from ovtrio.api.protocol.body import Body

FUNCTION_NAME = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")]


class FunctionSpec(Body):
    name: FUNCTION_NAME
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Body):
    """A function tool, in OpenAI's nested form {type, function: {name, ...}} or OVMS's
    flat form {type, name, description, parameters}."""

    type: Literal["function"]
    function: FunctionSpec | None = None
    name: FUNCTION_NAME | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _one_form(self) -> Tool:
        if self.function is None and self.name is None:
            raise ValueError("a function tool needs function.name (or name)")
        return self

    def spec(self) -> FunctionSpec:
        if self.function is not None:
            return self.function
        return FunctionSpec(
            name=self.name or "", description=self.description, parameters=self.parameters, strict=self.strict
        )


class NamedFunction(Body):
    name: str


class NamedToolChoice(Body):
    type: Literal["function"]
    function: NamedFunction | None = None
    name: str | None = None  # flat form

    def function_name(self) -> str | None:
        return self.function.name if self.function else self.name


class ReasoningOptions(Body):
    effort: Literal["minimal", "low", "medium", "high"] | None = None
    summary: str | None = None  # accepted, ignored


class ToolAndReasoningFields(Body):
    """Tools, structured output and reasoning: shared by chat completions and the
    Responses API."""

    prompt_field: ClassVar[str]  # the field that holds the conversation

    chat_template_kwargs: dict[str, Any] | None = None
    # Special-token text in the messages read as control tokens (true) or as text
    # (false); unset: the server's --parse-special-in-content (llama.cpp's name).
    parse_special: bool | None = None
    reasoning: ReasoningOptions | None = None
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None

    def output_format(self) -> dict[str, Any] | None:
        """The requested response format (structured output), if any."""
        return None

    def template_kwargs(self) -> dict[str, Any]:
        """Variables for the chat template: chat_template_kwargs, plus enable_thinking
        when a reasoning effort is asked for (any effort turns thinking on), and the
        effort itself as reasoning_effort (gpt-oss's template writes it into the system
        message)."""
        kwargs = dict(self.chat_template_kwargs or {})
        effort = (self.reasoning and self.reasoning.effort) or self.reasoning_effort
        if effort:
            kwargs.setdefault("enable_thinking", True)
            kwargs.setdefault("reasoning_effort", effort)
        return kwargs

    def tool_specs(self) -> list[FunctionSpec]:
        return [tool.spec() for tool in self.tools or []]

    def effective_tool_choice(self) -> str:
        """ "none", "auto", "required" or "function" (a named one); OpenAI's defaults."""
        if isinstance(self.tool_choice, NamedToolChoice):
            return "function"
        return self.tool_choice or ("auto" if self.tools else "none")

    @model_validator(mode="after")
    def _check_tools(self) -> ToolAndReasoningFields:
        names = [spec.name for spec in self.tool_specs()]
        if len(set(names)) != len(names):
            raise invalid("Tool names must be unique.", "tools")
        if self.tool_choice in ("required",) and not names:
            raise invalid("tool_choice 'required' needs tools.", "tool_choice")
        if isinstance(self.tool_choice, NamedToolChoice):
            wanted = self.tool_choice.function_name()
            if wanted not in names:
                raise invalid(f"tool_choice names '{wanted}', which is not among the tools.", "tool_choice")
        if self.tools and self.output_format() and self.effective_tool_choice() in ("required", "function"):
            raise invalid("A response format cannot be combined with a forced tool_choice.", "response_format")
        return self
