"""Request bodies of the OpenAI-compatible endpoints, validated with pydantic.

Validation is strict (no "5" for 5, no 1 for true), as OpenAI's API is. Unknown fields
are ignored, so do the fields OpenAI clients routinely send that change nothing here
(`user`, `service_tier`, `store`, ...; `metadata` once checked by OpenAI's rules). An
optional field sent as null takes its default, as OpenAI's nullable fields do. Fields
whose meaning the server cannot honour are refused by name (see UNSUPPORTED).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from ovtrio.api.errors import invalid
from ovtrio.scoring import MAX_TOP_LOGPROBS

MAX_SEED = 4294967295
MAX_N = 16

Probability = Annotated[float, Field(ge=0.0, le=1.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]


class _Body(BaseModel):
    # NaN and Infinity (which Python's JSON reader takes) are no value any field means.
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _null_is_the_default(cls, data: Any) -> Any:
        """OpenAI's spec marks most optional fields nullable, with null meaning "not
        set": an optional field sent as null takes its default. (A required one sent as
        null is still refused, naming it.)"""
        if isinstance(data, dict) and None in data.values():
            fields = cls.model_fields
            return {
                key: value
                for key, value in data.items()
                if value is not None or key not in fields or fields[key].is_required()
            }
        return data


# Bounds of integer fields that have no natural limit of their own, so that a value
# the engine would store in a narrower integer (or spend memory on) is refused by name.
MAX_TOP_K = 2**31 - 1
MAX_TOKEN_COUNT = 2**31 - 1


# OpenAI's rules for `metadata`: at most 16 pairs, keys of at most 64 characters,
# values strings of at most 512.
METADATA_PAIRS = 16
METADATA_KEY_CHARS = 64
METADATA_VALUE_CHARS = 512


def check_metadata(value: Any, param: str = "metadata") -> dict[str, str] | None:
    """`metadata` as OpenAI validates it; a 400 naming the offending pair otherwise."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid(f"Invalid type for '{param}': expected an object of string values.", param, "invalid_type")
    if len(value) > METADATA_PAIRS:
        raise invalid(
            f"Invalid '{param}': too many properties. Expected an object with at most {METADATA_PAIRS}"
            f" properties, but got an object with {len(value)} properties instead.",
            param,
            "object_above_max_length",
        )
    for key, item in value.items():
        if len(key) > METADATA_KEY_CHARS:
            raise invalid(
                f"Invalid '{param}': keys may be at most {METADATA_KEY_CHARS} characters long, and one has"
                f" {len(key)}.",
                f"{param}.{key[:METADATA_KEY_CHARS]}",
                "string_above_max_length",
            )
        if not isinstance(item, str):
            raise invalid(f"Invalid type for '{param}.{key}': expected a string.", f"{param}.{key}", "invalid_type")
        if len(item) > METADATA_VALUE_CHARS:
            raise invalid(
                f"Invalid '{param}.{key}': string too long. Expected a string with maximum length"
                f" {METADATA_VALUE_CHARS}, but got a string with length {len(item)} instead.",
                f"{param}.{key}",
                "string_above_max_length",
            )
    return value


class StreamOptions(_Body):
    include_usage: bool = False


class NvExt(_Body):
    """Dynamo's NVIDIA extension object; its fields override the top-level ones."""

    ignore_eos: bool | None = None
    top_k: Annotated[int, Field(ge=-1, le=MAX_TOP_K)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=2.0)] | None = None
    greedy_sampling: bool | None = None
    use_raw_prompt: bool | None = None
    annotations: list[str] | None = None


# How many strings a request may hold is a setting (max_stop_strings), checked with the
# request's other sizes (api/generation.py).
StopField = Annotated[str | list[str] | None, Field(description="strings where generation stops")]

# Fields whose meaning ovtrio cannot honour: sending a non-empty value is a 400 naming
# the field, rather than a silent difference. (Fields that change nothing, such as
# `user`, are simply ignored.)
UNSUPPORTED = {
    "logit_bias": "logit_bias is not supported",
    "suffix": "suffix (insertion) is not supported",
    "functions": "functions are not supported",
    "function_call": "function_call is not supported",
    "prompt_logprobs": "prompt_logprobs are not supported",
    "audio": "audio output is not supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
}

# Speculative decoding: candidates verified per step, and the longest n-gram prompt
# lookup matches. The bounds keep one request from making each engine step verify
# hundreds of tokens.
MAX_ASSISTANT_TOKENS = 64
MAX_NGRAM_SIZE = 64


class SamplingFields(_Body):
    """Fields shared by completions, chat completions and the Responses API."""

    # The field that holds the prompt, named when the prompt is too long.
    prompt_field: ClassVar[str] = "prompt"
    # Fields of UNSUPPORTED that this endpoint does serve.
    served_fields: ClassVar[frozenset[str]] = frozenset()

    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    best_of: Annotated[int, Field(ge=1, le=MAX_N)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=-1, le=MAX_TOP_K)] | None = None
    min_p: Annotated[float, Field(ge=0.0, lt=1.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=2.0)] | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    length_penalty: float = 1.0
    diversity_penalty: Annotated[float, Field(ge=0.0)] | None = None
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] | None = None
    stop: StopField = None
    stop_token_ids: list[Annotated[int, Field(ge=0, le=MAX_TOKEN_COUNT)]] | None = None
    include_stop_str_in_output: bool | None = None
    ignore_eos: bool = False
    min_tokens: Annotated[int, Field(ge=0, le=MAX_TOKEN_COUNT)] = 0
    skip_special_tokens: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    nvext: NvExt | None = None
    # Speculative decoding (OVMS's fields): served when the server speculates, see
    # ovtrio/api/sampling.py for which fields each way of speculating takes.
    num_assistant_tokens: Annotated[int, Field(ge=1, le=MAX_ASSISTANT_TOKENS)] | None = None
    assistant_confidence_threshold: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    max_ngram_size: Annotated[int, Field(ge=1, le=MAX_NGRAM_SIZE)] | None = None
    # Accepted on every endpoint (OpenAI's chat completions and Responses take it), and
    # checked by OpenAI's rules so that a client cannot park megabytes in a request.
    metadata: dict[str, str] | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            check_metadata(data.get("metadata"))
            for name, why in UNSUPPORTED.items():
                if name not in cls.served_fields and data.get(name) not in (None, {}, [], ""):
                    raise invalid(f"{why} by this server.", name, "unsupported_parameter")
        return data

    @model_validator(mode="after")
    def _check_combinations(self) -> "SamplingFields":
        top_k = self.effective_top_k()
        if top_k is not None and top_k != -1 and top_k < 1:
            param = "nvext.top_k" if self.nvext and self.nvext.top_k is not None else "top_k"
            raise invalid(f"Invalid value for '{param}': must be -1 (all tokens) or at least 1.", param)
        if self.best_of is not None and self.best_of < self.n:
            raise invalid("Invalid value for 'best_of': must be at least n.", "best_of")
        if self.stream and self.include_stop_str_in_output is False:
            raise invalid(
                "include_stop_str_in_output=false is not supported with stream=true: a streamed"
                " stop string may already have been sent when it is recognised.",
                "include_stop_str_in_output",
            )
        if self.num_assistant_tokens is not None and self.assistant_confidence_threshold is not None:
            raise invalid(
                "assistant_confidence_threshold cannot be used with num_assistant_tokens: the draft model proposes"
                " either a fixed number of tokens or as many as it is confident of; set one of them.",
                "assistant_confidence_threshold",
            )
        max_tokens, max_param = self.requested_max_tokens()
        if self.min_tokens and max_tokens is not None and self.min_tokens > max_tokens:
            raise invalid(f"Invalid value for 'min_tokens': must not exceed {max_param}.", "min_tokens")
        return self

    def requested_max_tokens(self) -> tuple[int | None, str]:
        """The output limit the client set, and the field that set it."""
        return self.max_tokens, "max_tokens"

    def wants_logprobs(self) -> bool:
        """Whether the chosen tokens' log-probabilities were asked for."""
        return False

    def scores_prompt(self) -> bool:
        """Whether the engine must score the prompt (return its tokens' log-probabilities)."""
        return False

    def beam_width(self) -> int:
        return self.best_of or 1

    def effective_top_k(self) -> int | None:
        return self.nvext.top_k if self.nvext and self.nvext.top_k is not None else self.top_k

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class CompletionRequest(SamplingFields):
    served_fields: ClassVar[frozenset[str]] = frozenset({"prompt_logprobs"})

    prompt: str | Annotated[list[str], Field(min_length=1)] | TokenIds | Annotated[list[TokenIds], Field(min_length=1)]
    # 0 with echo scores the prompt and generates nothing (OpenAI's legacy scoring).
    max_tokens: Annotated[int, Field(ge=0)] | None = None
    echo: bool = False
    # The chosen token's log-probability and the `logprobs` most likely tokens'.
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    # vLLM's: each prompt token's log-probability and rank, and the `prompt_logprobs`
    # most likely tokens', in the choice's `prompt_logprobs`.
    prompt_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None

    def wants_logprobs(self) -> bool:
        return self.logprobs is not None  # 0 asks for them too: the chosen token only

    def echoes_logprobs(self) -> bool:
        """Echo with logprobs: the logprobs cover the prompt's tokens, then the completion's."""
        return self.echo and self.logprobs is not None

    def scores_prompt(self) -> bool:
        """Whether the prompt's log-probabilities are asked for (the scoring path)."""
        return self.echoes_logprobs() or self.prompt_logprobs is not None

    def top_logprobs(self) -> int:
        """How many of the most likely tokens each logprobs entry lists."""
        return self.logprobs or 0

    def needs_scoring(self) -> bool:
        """Whether the scoring path runs: the prompt is scored, or the generated tokens'
        most likely alternatives are asked for (the engine reports the chosen token's only)."""
        return self.scores_prompt() or (self.top_logprobs() > 0 and self.max_tokens != 0)

    @model_validator(mode="after")
    def _check_logprobs(self) -> "CompletionRequest":
        if self.max_tokens == 0 and not self.echo:
            raise invalid(
                "Invalid value for 'max_tokens': 0 generates nothing, which is only useful with echo=true"
                " (to score the prompt); it must be at least 1.",
                "max_tokens",
            )
        return self


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ImageURL(_Body):
    url: str
    detail: Literal["auto", "low", "high"] | None = None  # accepted; the model's preprocessor decides


class ImagePart(_Body):
    """An image in a message: a data: URL (base64), or an http(s) URL where the server
    fetches them (ovtrio/images)."""

    type: Literal["image_url"]
    image_url: ImageURL | str
    # The request field that held it, when it came from another shape of request (a
    # Responses input_image): named in errors.
    _source_param: str | None = PrivateAttr(None)

    @property
    def source_param(self) -> str | None:
        return self._source_param

    def held_in(self, param: str) -> "ImagePart":
        self._source_param = param
        return self

    @property
    def url(self) -> str:
        return self.image_url if isinstance(self.image_url, str) else self.image_url.url


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class FunctionCall(_Body):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCallRef(_Body):
    """A tool call in an assistant message of the history."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallRef] | None = None  # assistant
    tool_call_id: str | None = None  # tool

    @model_validator(mode="after")
    def _check_role_fields(self) -> "ChatMessage":
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


FUNCTION_NAME = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")]


class FunctionSpec(_Body):
    name: FUNCTION_NAME
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Body):
    """A function tool, in OpenAI's nested form {type, function: {name, ...}} or OVMS's
    flat form {type, name, description, parameters}."""

    type: Literal["function"]
    function: FunctionSpec | None = None
    name: FUNCTION_NAME | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _one_form(self) -> "Tool":
        if self.function is None and self.name is None:
            raise ValueError("a function tool needs function.name (or name)")
        return self

    def spec(self) -> FunctionSpec:
        if self.function is not None:
            return self.function
        return FunctionSpec(name=self.name or "", description=self.description, parameters=self.parameters, strict=self.strict)


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction | None = None
    name: str | None = None  # flat form

    def function_name(self) -> str | None:
        return self.function.name if self.function else self.name


class ReasoningOptions(_Body):
    effort: Literal["minimal", "low", "medium", "high"] | None = None
    summary: str | None = None  # accepted, ignored


class ToolAndReasoningFields(_Body):
    """Tools, structured output and reasoning: shared by chat completions and the
    Responses API."""

    chat_template_kwargs: dict[str, Any] | None = None
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
        when a reasoning effort is asked for (any effort turns thinking on)."""
        kwargs = dict(self.chat_template_kwargs or {})
        if (self.reasoning and self.reasoning.effort) or self.reasoning_effort:
            kwargs.setdefault("enable_thinking", True)
        return kwargs

    def tool_specs(self) -> list[FunctionSpec]:
        return [tool.spec() for tool in self.tools or []]

    def effective_tool_choice(self) -> str:
        """"none", "auto", "required" or "function" (a named one); OpenAI's defaults."""
        if isinstance(self.tool_choice, NamedToolChoice):
            return "function"
        return self.tool_choice or ("auto" if self.tools else "none")

    @model_validator(mode="after")
    def _check_tools(self) -> "ToolAndReasoningFields":
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


class ChatCompletionRequest(SamplingFields, ToolAndReasoningFields):
    prompt_field: ClassVar[str] = "messages"

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    response_format: dict[str, Any] | None = None

    def output_format(self) -> dict[str, Any] | None:
        return self.response_format

    def wants_logprobs(self) -> bool:
        return self.logprobs

    def requested_max_tokens(self) -> tuple[int | None, str]:
        # max_completion_tokens, OpenAI's newer name, wins over max_tokens.
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"

    @model_validator(mode="after")
    def _check_logprobs(self) -> "ChatCompletionRequest":
        if self.top_logprobs is not None and not self.logprobs:
            raise invalid("top_logprobs requires logprobs=true.", "top_logprobs")
        return self
