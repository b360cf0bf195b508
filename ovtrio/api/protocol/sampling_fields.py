"""The fields every generation endpoint shares (completions, chat completions, the
Responses API): sampling, stop conditions, streaming, speculative decoding; and the
fields no endpoint serves, refused by name."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import Field, model_validator

from ovtrio.api.errors import invalid
from ovtrio.api.protocol.body import Body
from ovtrio.api.protocol.keep_alive import KeepAlive
from ovtrio.api.protocol.metadata import check_metadata

MAX_SEED = 4294967295
MAX_N = 16

Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]

# Bounds of integer fields that have no natural limit of their own, so that a value
# the engine would store in a narrower integer (or spend memory on) is refused by name.
MAX_TOP_K = 2**31 - 1
MAX_TOKEN_COUNT = 2**31 - 1


class StreamOptions(Body):
    include_usage: bool = False


class NvExt(Body):
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


class SamplingFields(Body):
    """Fields shared by completions, chat completions and the Responses API."""

    # The field that holds the prompt, named when the prompt is too long.
    prompt_field: ClassVar[str] = "prompt"
    # Fields of UNSUPPORTED that this endpoint does serve.
    served_fields: ClassVar[frozenset[str]] = frozenset()

    model: str
    # Seconds the model stays loaded after this request (Ollama's keep_alive).
    keep_alive: KeepAlive | None = None
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
    def _check_combinations(self) -> SamplingFields:
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
