"""One model's settings: those a config file's model entry may set.

`ModelSettings` holds the settings of one model and its engine (the source, the chat
format, the device and backend, the KV cache, speculation, admission limits, streaming).
The server's own settings (listening, keys, the response store, the model cache, the
drain, logging, ...) are `ovtrio.settings.server.ServerSettings`; `Settings` combines
the two. A config file's entry is validated as a `ModelSettings` (ovtrio.settings.config_file),
so a field added here may be set per model there at once.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# OpenVINO properties that a setting of their own controls.
OWN_SETTING_PROPERTIES = {
    "INFERENCE_PRECISION_HINT": "inference_precision",
    "KV_CACHE_PRECISION": "kv_cache_precision",
    "INFERENCE_NUM_THREADS": "num_threads",
}


class ModelSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(
        None,
        description="OpenVINO IR folder or .gguf file to serve; the embedded SmolLM2-135M-Instruct when unset",
    )
    model_kind: Literal["auto", "generation", "embedding", "rerank", "transcription", "speech"] = Field(
        "auto",
        description="what the model is: generation (chat and completions), embedding (/v1/embeddings), rerank"
        " (a cross-encoder, /v1/rerank), transcription (Whisper, /v1/audio/transcriptions and translations) or"
        " speech (SpeechT5, /v1/audio/speech); auto reads it off the IR's outputs (last_hidden_state: embedding,"
        " logits of rank 2: rerank) or, for Whisper and SpeechT5, their IRs and config",
    )
    served_model_name: str | None = Field(
        None, description="model id clients send and /v1/models lists (default: derived from the path)"
    )
    chat_template: str | None = Field(
        None, description="file with a Jinja chat template to use instead of the model's own"
    )
    parse_special_in_content: bool = Field(
        False,
        description="read special-token text (such as <|im_start|>) in the messages of chat, Responses and"
        " Messages requests as the control tokens it names, as a raw prompt does; by default it is text (a"
        " request's parse_special says otherwise for that request)",
    )
    tool_parser: (
        Literal[
            "hermes",
            "qwen",
            "qwen3_coder",
            "llama3_json",
            "pythonic",
            "mistral",
            "phi4_mini",
            "harmony",
            "json_tool_calls",
            "qwen3coder",
            "qwen3_xml",
            "llama4_pythonic",
            "phi4",
            "phi4_mini_json",
            "gptoss",
            "openai",
            "none",
        ]
        | None
    ) = Field(
        None,
        description="how the model writes tool calls for tool_choice auto (default: guessed from its chat"
        " template, see docs/models.md): hermes and qwen <tool_call> JSON, qwen3_coder <tool_call><function=...>"
        " XML, llama3_json bare JSON, pythonic [f(x=1)], mistral [TOOL_CALLS], phi4_mini <|tool_call|> or"
        " functools[...], harmony gpt-oss's channels (which carry its reasoning too), json_tool_calls the"
        ' {"tool_calls": [...]} reply that OpenVINO GenAI\'s template polyfill teaches models whose template has'
        " no tool support, which get it by default; vLLM's and OVMS's names for these (qwen3coder, qwen3_xml,"
        " llama4_pythonic, phi4, phi4_mini_json, gptoss, openai) are accepted too",
    )
    reasoning_parser: Literal["think", "deepseek_r1", "qwen3", "none"] | None = Field(
        None,
        description="split <think> reasoning from content (default: on when the chat template uses <think>);"
        " deepseek_r1 and qwen3, vLLM's and OVMS's names, are think too. gpt-oss's reasoning comes with"
        " tool_parser harmony",
    )
    gguf_conversion: Literal["exact", "small"] = Field(
        "exact",
        description="GGUF tensor types the engine cannot read are rewritten once at load (kept in the model"
        " cache): exact keeps every weight where a type the engine reads holds it (Q5_0, IQ4_NL, MXFP4 as Q8_0,"
        " Q3_K as Q6_K, BF16 as F16) and otherwise uses Q8_0, within 1/254 of each 32-weight block's largest;"
        " small uses Q6_K or Q4_1 instead (a smaller, faster model, further from the file; see docs/models.md)",
    )
    load_timeout: float = Field(
        3600.0,
        ge=0,
        description="seconds a load of the model (conversion, compile, warm-up) may take before it is failed with"
        " the phase it hung in named in the log (`ovtrio serve` then exits with status 1 if no model is left);"
        " 0 waits for ever",
    )
    device: str = Field(
        "CPU",
        description="OpenVINO device: CPU, GPU, GPU.1, NPU, AUTO, HETERO:GPU,CPU, ...; a device this machine lacks"
        " is refused at startup in one line",
    )
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
        2048,
        ge=1,
        description="most tokens processed in one engine step (prompt chunks included): a prompt prefills in steps"
        " of this many tokens while nothing else decodes (the default is where the engine's prefill tokens a second"
        " level off on CPU: docs/benchmarks.md#prefill-speed-against-the-step-budget)",
    )
    enable_prefix_caching: bool = Field(True, description="reuse KV cache of shared prompt prefixes")
    max_itl_ms: float = Field(
        200.0,
        gt=0,
        description="bound on the gap between the tokens of decoding streams while long prompts prefill beside"
        " them: a prompt's slices are sized so that each step takes at most this long, by the scheduler's"
        " estimate of the engine's speed, oldest prompt first (a step takes one KV block of a prompt at"
        " least); needs prefix caching, without which the engine takes a whole step's budget of a prompt",
    )
    long_prefill_token_threshold: int | None = Field(
        None,
        ge=0,
        description="prompts longer than this many tokens are prefilled in fixed slices of at most that size (whole"
        " KV blocks) in place of the slices max_itl_ms sizes; needs prefix caching (default: unset, slices"
        " sized by max_itl_ms for prompts longer than 256 tokens; 0 turns slicing off)",
    )
    scoring_chunk_tokens: int = Field(
        128,
        ge=1,
        description="positions the scoring path (prompt logprobs, top logprobs) runs through the model in one"
        " inference; bounds its memory (chunk x vocabulary floats)",
    )
    max_stop_strings: int = Field(
        64, ge=1, description="most strings a request's `stop` may hold; more get 400 naming stop"
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
        " '{\"DYNAMIC_QUANTIZATION_GROUP_SIZE\": 0}'; also given to the draft model. Properties that a setting"
        " of their own controls (precision, KV cache precision, threads) are refused here, naming the setting; a"
        " property the device does not know fails the load in one line naming it",
    )
    prompt_lookup: bool = Field(
        False,
        description="speculate by prompt lookup: propose the tokens that followed the latest n-gram's earlier"
        " occurrence in the text (requests may set num_assistant_tokens and max_ngram_size)",
    )
    draft_model: str | None = Field(
        None,
        description="speculate with this draft model (OpenVINO IR folder or .gguf file, with the main model's"
        " tokenizer; a .gguf file is converted once, into drafts/ of the model cache); requests may set"
        " num_assistant_tokens or assistant_confidence_threshold; not with prompt_lookup",
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
        " (default: twice max_running_sequences; 16 on the stateful backend)",
    )
    max_prompts_per_request: int = Field(
        64, ge=1, description="most prompts in one completions request; more get 400 naming prompt"
    )
    max_choices_per_request: int | None = Field(
        None,
        ge=1,
        description="most choices in one request, n x prompts; more get 400 naming n (default: 64, or"
        " max_running_sequences if lower)",
    )
    max_prompt_tokens_per_request: int | None = Field(
        None,
        ge=1,
        description="most prompt tokens in one request, all its prompts together; more get 400 naming prompt"
        " (messages on chat) (default: what the KV cache holds)",
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


# The settings a config file's model entry may set, in the order of their fields.
PER_MODEL_SETTINGS = tuple(ModelSettings.model_fields)
