"""Server settings, read from OVTRIO_* environment variables or `ovtrio serve` flags.

Every setting has one name: the field name. The environment variable is that name in
upper case with the OVTRIO_ prefix, the command-line flag is the name with dashes
(`max_num_seqs` -> `OVTRIO_MAX_NUM_SEQS`, `--max-num-seqs`).
"""

from __future__ import annotations

import json
import os
import re
import typing
from typing import Any, Literal, Mapping

from pydantic import BaseModel, Field, ValidationError, field_validator

ENV_PREFIX = "OVTRIO_"


class Settings(BaseModel):
    model_config = {"extra": "forbid"}

    config: str | None = Field(
        None,
        description="JSON or TOML file listing several models to serve, each with its own settings (the other"
        " settings act as every model's defaults; see the README)",
    )
    model: str | None = Field(
        None,
        description="OpenVINO IR folder or .gguf file to serve; the embedded SmolLM2-135M-Instruct when unset",
    )
    served_model_name: str | None = Field(
        None, description="model id clients send and /v1/models lists (default: derived from the path)"
    )
    chat_template: str | None = Field(
        None, description="file with a Jinja chat template to use instead of the model's own"
    )
    tool_parser: Literal["hermes", "qwen", "llama3_json", "mistral", "json_tool_calls", "none"] | None = Field(
        None, description="how the model writes tool calls (default: guessed from its chat template)"
    )
    reasoning_parser: Literal["think", "none"] | None = Field(
        None, description="split <think> reasoning from content (default: on when the chat template uses <think>)"
    )
    device: str = Field("CPU", description="OpenVINO device: CPU, GPU, NPU, ...")
    backend: Literal["auto", "continuous_batching", "stateful"] = Field(
        "auto",
        description="engine backend: continuous_batching (many requests share each step; CPU and GPU), stateful"
        " (OpenVINO GenAI's LLMPipeline, one request at a time, the only one the NPU runs); auto picks stateful"
        " on NPU, continuous_batching elsewhere",
    )
    max_prompt_len: int | None = Field(
        None,
        ge=1,
        description="stateful backend: longest prompt in tokens, compiled into the model on NPU; longer prompts get"
        " 400 (default: 1024 on NPU, the model's context elsewhere)",
    )
    min_response_len: int | None = Field(
        None,
        ge=1,
        description="stateful backend: tokens the NPU model keeps room for after the longest prompt (default: 128 on"
        " NPU); the context is max_prompt_len + min_response_len there",
    )
    cache_size: int = Field(1, ge=0, description="KV cache size in GB (0 lets the engine size it on demand)")
    num_kv_blocks: int | None = Field(
        None, ge=1, description="KV cache size in blocks (of 32 tokens on CPU); overrides cache_size"
    )
    max_num_seqs: int = Field(256, ge=1, description="most sequences scheduled in one engine step")
    max_num_batched_tokens: int = Field(
        256, ge=1, description="most tokens processed in one engine step (prompt chunks included)"
    )
    enable_prefix_caching: bool = Field(True, description="reuse KV cache of shared prompt prefixes")
    long_prefill_token_threshold: int | None = Field(
        None,
        ge=0,
        description="prompts longer than this many tokens are prefilled in slices of at most that size (whole KV"
        " blocks), so requests arriving meanwhile start between slices instead of after the whole prompt; needs"
        " prefix caching (default: three eighths of max_num_batched_tokens; 0 turns it off)",
    )
    scoring_chunk_tokens: int = Field(
        128,
        ge=1,
        description="positions the scoring path (prompt logprobs, top logprobs) runs through the model in one"
        " inference; bounds its memory (chunk x vocabulary floats)",
    )
    max_stop_strings: int = Field(64, ge=1, description="most strings a request's `stop` may hold")
    cache_dir: str | None = Field(
        None,
        description="folder that keeps the model and tokenizer converted from a GGUF file, for faster later starts"
        " (default: $XDG_CACHE_HOME/ovtrio, or ~/.cache/ovtrio)",
    )
    model_cache: bool = Field(
        True,
        description="use cache_dir; --no-model-cache converts a GGUF file afresh at every start and writes nothing"
        " (but a temporary copy of a GGUF file the server cannot write)",
    )
    data_dir: str | None = Field(
        None,
        description="the one folder the server writes to, when set (a container's volume): the model cache is"
        " DATA_DIR/cache unless cache_dir is set, and a relative response_store_path is taken in it",
    )
    prebuilt_cache_dir: str | None = Field(
        None,
        description="a model cache that is only read, looked in before cache_dir (an image's, filled when it was"
        " built, so its first start skips the conversion); a model it lacks is converted into cache_dir",
    )
    inference_precision: Literal["auto", "f32", "bf16", "f16"] = Field(
        "auto",
        description="precision the device computes in (auto: the device's choice, bf16 on CPUs with AVX-512 BF16"
        " or AMX, f32 on others); f32 makes greedy output exact and independent of batching",
    )
    kv_cache_precision: Literal["auto", "f32", "bf16", "f16", "u8", "u4"] = Field(
        "auto",
        description="precision of the KV cache (auto: the device's choice); f32 makes output read from the prefix"
        " cache equal output computed afresh, and needs inference_precision f32 on CPUs that compute in bf16",
    )
    num_threads: int | None = Field(
        None,
        ge=1,
        description="CPU threads the engine computes with (default: one per core); fewer leave cores to other"
        " servers or models on the machine (a small model loses little speed on one thread and saves a third"
        " of the CPU)",
    )
    plugin_config: dict[str, bool | int | float | str] = Field(
        default_factory=dict,
        description="OpenVINO properties for the device, as a JSON object (OVMS's plugin_config), e.g."
        ' \'{"DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}\'; also given to the draft model',
    )
    prompt_lookup: bool = Field(
        False,
        description="speculate by prompt lookup: propose the tokens that followed the latest n-gram's earlier"
        " occurrence in the text (requests may set num_assistant_tokens and max_ngram_size)",
    )
    draft_model: str | None = Field(
        None,
        description="speculate with this draft model (OpenVINO IR folder or .gguf file, with the main model's"
        " tokenizer); requests may set num_assistant_tokens or assistant_confidence_threshold",
    )
    draft_device: str | None = Field(None, description="device of the draft model (default: the main model's)")
    draft_cache_size: int | None = Field(
        None,
        ge=1,
        description="KV cache size of the draft model in GB (default: the engine splits cache_size between the"
        " two models by their hidden sizes)",
    )
    max_tokens_limit: int | None = Field(
        None, ge=1, description="default and cap for max_tokens (OVMS's max_tokens_limit)"
    )
    max_running_sequences: int | None = Field(
        None,
        ge=1,
        description="sequences (each choice of each prompt) in the engine at once; further requests wait in"
        " a queue (default: max_num_seqs, or fewer when the KV cache cannot hold 1024 tokens for each)",
    )
    max_queued_requests: int | None = Field(
        None,
        ge=0,
        description="requests waiting for room in the engine; beyond them requests get 429 with Retry-After"
        " (default: twice max_running_sequences)",
    )
    max_prompts_per_request: int = Field(64, ge=1, description="most prompts in one completions request")
    max_choices_per_request: int | None = Field(
        None,
        ge=1,
        description="most choices in one request, n x prompts (default: 64, or max_running_sequences if lower)",
    )
    max_prompt_tokens_per_request: int | None = Field(
        None,
        ge=1,
        description="most prompt tokens in one request, all its prompts together (default: what the KV cache holds)",
    )
    slow_reader_buffer: int = Field(
        128,
        ge=1,
        description="messages a request may have waiting for a client that does not read before it is paused"
        " (its tokens then wait in the engine)",
    )
    slow_reader_timeout: float = Field(
        30.0, gt=0, description="seconds a paused request waits for its client to read before it is cancelled"
    )
    stream_interval: int = Field(
        0,
        ge=0,
        description="engine steps between streamed chunks (0: 1, or 2-3 when 12+ streams share the engine)",
    )
    gil_free_step: bool = Field(
        True,
        description="step the engine without holding the GIL, so the server answers while a step runs"
        " (falls back to the binding's step() if the check at startup fails)",
    )
    max_images_per_request: int = Field(
        4, ge=0, description="vision-language models: most images in one request (a conversation's included)"
    )
    max_image_bytes: int = Field(
        10 * 1024 * 1024,
        ge=1,
        description="vision-language models: largest image, in bytes (decoded from base64); a server serving one"
        " takes bodies this much larger for each image a request may carry",
    )
    max_image_side: int = Field(
        2048,
        ge=16,
        description="vision-language models: images whose longer side has more pixels are resized down to it"
        " (aspect kept), not refused",
    )
    image_urls: bool = Field(
        False,
        description="vision-language models: fetch http(s) image URLs (off: data: URLs only; a server that fetches"
        " the URLs it is sent can be made to reach addresses only it can reach)",
    )
    image_fetch_timeout: float = Field(10.0, gt=0, description="seconds to fetch one image URL (with --image-urls)")
    model_kind: Literal["auto", "generation", "embedding", "rerank"] = Field(
        "auto",
        description="what the model is: generation (chat and completions), embedding (/v1/embeddings) or rerank"
        " (a cross-encoder, /v1/rerank); auto reads it off the IR's outputs (last_hidden_state: embedding,"
        " logits of rank 2: rerank)",
    )
    embeddings: bool = Field(
        True,
        description="serve the embedded all-MiniLM-L6-v2 at /v1/embeddings when no other embedding model is"
        " configured (--no-embeddings turns it off)",
    )
    embedding_model: str | None = Field(
        None,
        description="OpenVINO IR folder of an embedding model to serve at /v1/embeddings instead of the embedded"
        " one (optimum-cli export openvino --task feature-extraction)",
    )
    rerank_model: str | None = Field(
        None,
        description="OpenVINO IR folder of a cross-encoder to serve at /v1/rerank (optimum-cli export openvino"
        " --task text-classification)",
    )
    encoder_preload: bool = Field(
        False,
        description="load the embedding and rerank models at start, not on their first request",
    )
    encoder_device: str | None = Field(None, description="device of the embedding and rerank models (default: device)")
    encoder_inference_precision: Literal["auto", "f32", "bf16", "f16"] = Field(
        "auto", description="precision the embedding and rerank models compute in (auto: the device's choice)"
    )
    encoder_max_batch: int = Field(
        32, ge=1, description="most inputs an embedding model computes at once (requests waiting together are batched)"
    )
    encoder_max_queued_requests: int = Field(
        64,
        ge=0,
        description="embedding or rerank requests waiting for their model; beyond them requests get 429",
    )
    max_inputs_per_request: int = Field(
        2048, ge=1, description="most inputs in one embeddings request, and documents in one rerank request"
    )
    response_store_size: int = Field(1000, ge=0, description="stored responses kept for retrieval and chaining")
    response_store_ttl: float = Field(3600.0, gt=0, description="seconds a stored response is kept")
    response_store_bytes: int = Field(
        64 * 1024 * 1024,
        ge=0,
        description="bytes of memory the stored responses may take (oldest dropped first), beside"
        " response_store_size",
    )
    max_body_bytes: int = Field(
        2 * 1024 * 1024,
        ge=1024,
        description="largest request body (and Responses WebSocket frame) in bytes; larger ones get 413",
    )
    max_schema_bytes: int = Field(
        64 * 1024,
        ge=1024,
        description="largest JSON schema of one response format or tool, in bytes of compact JSON; larger"
        " ones get 400 naming the parameter",
    )
    grammar_cache_bytes: int = Field(
        32 * 1024 * 1024,
        ge=0,
        description="bytes of compiled grammars (structured output) each model's engine keeps for reuse, by"
        " XGrammar's estimate; least recently used dropped first",
    )
    response_store_path: str | None = Field(
        None, description="SQLite file that keeps stored responses across restarts (default: memory only)"
    )
    api_key: list[str] = Field(
        default_factory=list,
        description="key clients must send as 'Authorization: Bearer <key>' (repeat the flag for several; the"
        " environment variable holds one)",
    )
    api_key_file: str | None = Field(
        None, description="file of accepted API keys, one a line (blank lines and # comments skipped)"
    )
    protect_metrics: bool = Field(False, description="require an API key for /metrics too")
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host header values the server answers, names with or without a port (a name alone allows"
        " every port), comma-separated or the flag repeated; '*' allows any (default: on a connection to a loopback"
        " address, only localhost, 127.0.0.1 and [::1]; any host on other addresses). Refused hosts get 403: a"
        " page that rebinds its own name to this address cannot use the server",
    )
    allowed_origins: list[str] = Field(
        default_factory=list,
        description="web origins (scheme://host[:port]) whose pages may call the server from a browser, HTTP and"
        " WebSocket, comma-separated or the flag repeated; '*' allows every page (default: none but the server's"
        " own origin). Other origins get 403 and a refused WebSocket handshake",
    )
    websocket_max_message_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description="largest Responses WebSocket message, in bytes (all of its frames); a larger one is dropped"
        " unread and answered with an error event, and the socket stays open",
    )
    websocket_idle_timeout: float = Field(
        300.0,
        gt=0,
        description="seconds a Responses WebSocket may stay open with no message from the client and no response"
        " running; then it is closed (code 1000)",
    )
    playground: bool = Field(
        True, description="serve the browser playground at / (--no-playground leaves / a 404)"
    )
    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8000, ge=0, le=65535, description="port to listen on (0 picks a free one)")
    drain_timeout: float = Field(
        30.0,
        ge=0,
        description="seconds requests in flight may run on after SIGTERM or SIGINT before they are ended with an"
        " error (new ones are refused meanwhile)",
    )
    log_level: str = Field("info", description="debug, info, warning or error")

    @field_validator("allowed_hosts", "allowed_origins", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        """Several values in one flag or variable, separated by commas."""
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list):
            return [part.strip() for item in value for part in str(item).split(",") if part.strip()]
        return value

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, value: list[str]) -> list[str]:
        for origin in value:
            if origin not in ("*", "null") and not re.fullmatch(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#\s]+/?", origin):
                raise ValueError(f"{origin!r} is not an origin: scheme://host[:port], '*' or 'null'")
        return value

    @field_validator("plugin_config", mode="before")
    @classmethod
    def _plugin_config_object(cls, value: Any) -> Any:
        """A JSON object from a flag or variable (a config file gives the object itself);
        the properties that settings of their own control are refused, naming them."""
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"not JSON: {exc.msg}") from None
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(item, (bool, int, float, str)):
                    raise ValueError(f"{key}: a property's value is a string, a number or a boolean")
            for key, setting in OWN_SETTING_PROPERTIES.items():
                if key in value:
                    raise ValueError(f"{key} is set with --{setting.replace('_', '-')}, not here")
        return value


# The settings a model entry of the config file may set: those of one model and its
# engine. The others (listening, keys, the response store, the drain, logging, the model
# cache) are the server's, and are set once, on the command line or in the environment.
PER_MODEL_SETTINGS = (
    "model",
    "model_kind",
    "served_model_name",
    "chat_template",
    "tool_parser",
    "reasoning_parser",
    "device",
    "backend",
    "max_prompt_len",
    "min_response_len",
    "cache_size",
    "num_kv_blocks",
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_prefix_caching",
    "long_prefill_token_threshold",
    "scoring_chunk_tokens",
    "max_stop_strings",
    "inference_precision",
    "kv_cache_precision",
    "num_threads",
    "plugin_config",
    "prompt_lookup",
    "draft_model",
    "draft_device",
    "draft_cache_size",
    "max_tokens_limit",
    "max_running_sequences",
    "max_queued_requests",
    "max_prompts_per_request",
    "max_choices_per_request",
    "max_prompt_tokens_per_request",
    "slow_reader_buffer",
    "slow_reader_timeout",
    "stream_interval",
    "gil_free_step",
)

# OpenVINO properties that a setting of their own controls.
OWN_SETTING_PROPERTIES = {
    "INFERENCE_PRECISION_HINT": "inference_precision",
    "KV_CACHE_PRECISION": "kv_cache_precision",
    "INFERENCE_NUM_THREADS": "num_threads",
}


def in_data_dir(settings: Settings, path: str | None) -> str | None:
    """`path` as the server opens it: a relative path is taken in data_dir, when that is set."""
    if path is None or settings.data_dir is None or os.path.isabs(os.path.expanduser(path)):
        return path
    return os.path.join(os.path.expanduser(settings.data_dir), path)


class SettingsError(ValueError):
    """A setting could not be parsed; the message names it."""


def settings_from_env(environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Build settings from OVTRIO_* variables, with explicit overrides taking precedence."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for name in Settings.model_fields:
        raw = environ.get(ENV_PREFIX + name.upper())
        if raw is not None and raw != "":
            values[name] = [raw] if is_list_setting(name) else raw
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return Settings.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0])
        raise SettingsError(
            f"invalid setting {name} ({ENV_PREFIX}{name.upper()} / --{name.replace('_', '-')}): {first['msg']}"
        ) from None


def is_list_setting(name: str) -> bool:
    """A setting that takes several values: a repeatable flag, one value in its variable."""
    return typing.get_origin(Settings.model_fields[name].annotation) is list


def api_keys(settings: Settings) -> tuple[str, ...]:
    """Every accepted key: the api_key values, then the lines of api_key_file."""
    keys = [key for key in settings.api_key if key]
    if settings.api_key_file:
        try:
            with open(settings.api_key_file, encoding="utf-8") as file:
                lines = [line.strip() for line in file]
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise SettingsError(f"cannot read API key file {settings.api_key_file}: {reason}") from None
        from_file = [line for line in lines if line and not line.startswith("#")]
        if not from_file:
            raise SettingsError(f"API key file {settings.api_key_file} holds no keys")
        keys.extend(from_file)
    return tuple(keys)
