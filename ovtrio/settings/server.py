"""Server settings, read from OVTRIO_* environment variables or `ovtrio serve` flags.

Every setting has one name: the field name. The environment variable is that name in
upper case with the OVTRIO_ prefix, the command-line flag is the name with dashes
(`max_num_seqs` -> `OVTRIO_MAX_NUM_SEQS`, `--max-num-seqs`).

`Settings`, what the server runs with, is the server's own settings (`ServerSettings`,
here: set once, on the command line or in the environment) and one model's
(`ovtrio.settings.model.ModelSettings`: also what a config file's entry may set).
docs/configuration.md lists them all; scripts/settings_docs.py writes it from these
classes.
"""

from __future__ import annotations

import os
import re
import typing
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ovtrio.settings.model import ModelSettings

ENV_PREFIX = "OVTRIO_"


class ServerSettings(BaseModel):
    """The settings of the server as a whole, beside its models'."""

    model_config = ConfigDict(extra="forbid")

    config: str | None = Field(
        None,
        description="JSON or TOML file listing several models to serve, each with its own settings (the other"
        " settings act as every model's defaults; see docs/configuration.md)",
    )
    models_dir: str | None = Field(
        None,
        description="folder of models served on demand: each GGUF file and OpenVINO IR folder in it is a model"
        " (generation, vision, embedding, rerank or Whisper, told by its files), named after the file (without"
        " .gguf) or folder, loaded on its first request; a file added later is found without a restart (without"
        " --model or --config, only the folder's models are served)",
    )
    models_max: int = Field(
        0,
        ge=0,
        description="most models loaded at once, embedding, rerank, transcription and speech models included (0: no"
        " limit); loading one more first unloads the least recently used one that runs no request",
    )
    models_autoload: bool = Field(
        True,
        description="load a model on the first request that names it (--no-models-autoload: only POST"
        " /models/load loads one, and a request for an unloaded model gets 404 saying so)",
    )
    models_load_wait: float = Field(
        30.0,
        ge=0,
        description="seconds a load waits for --models-max room (every loaded model running requests) before the"
        " requests waiting for it get 503 with Retry-After",
    )
    model_idle_unload: float | None = Field(
        None,
        ge=0,
        description="unload a model after this many seconds without a request (Ollama's keep_alive; a request's"
        " keep_alive overrides it for its model; default: keep loaded)",
    )
    compile_cache: bool = Field(
        False,
        description="keep the engine's compiled models in cache_dir/compiled (OpenVINO's CACHE_DIR) and load"
        " them from there on later loads (not on CPU with the continuous-batching backend: its CPU plugin cannot"
        " import what it compiled, and every load gets slower)",
    )
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
    max_image_pixels: int = Field(
        16 * 1024 * 1024,
        ge=1,
        description="vision-language models: most pixels an image may decode to (a JPEG counted at the reduced"
        " scale it is decoded at), read from its header before decoding; larger images get 400",
    )
    image_decodes: int = Field(
        2,
        ge=1,
        description="vision-language models: images decoded at once (at most one fewer than the cores); with"
        " max_image_pixels, bounds the memory decoding takes",
    )
    image_urls: bool = Field(
        False,
        description="vision-language models: fetch http(s) image URLs (off: data: URLs only; a server that fetches"
        " the URLs it is sent can be made to reach addresses only it can reach)",
    )
    image_fetch_timeout: float = Field(10.0, gt=0, description="seconds to fetch one image URL (with --image-urls)")
    image_fetch_private_addresses: bool = Field(
        False,
        description="with --image-urls, fetch from loopback, private and link-local addresses too (localhost, 10.x,"
        " 192.168.x, 169.254.x, ...; off: only public addresses, checked after the name is resolved)",
    )
    embeddings: bool = Field(
        True,
        description="serve the embedded all-MiniLM-L6-v2 at /v1/embeddings when no other embedding model is"
        " configured or in --models-dir at start (--no-embeddings turns it off)",
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
    transcription_model: str | None = Field(
        None,
        description="OpenVINO IR folder of a Whisper model to serve at /v1/audio/transcriptions and"
        " /v1/audio/translations (optimum-cli export openvino --model openai/whisper-base FOLDER)",
    )
    speech_model: str | None = Field(
        None,
        description="OpenVINO IR folder of a text-to-speech model (SpeechT5 with its vocoder) to serve at"
        " /v1/audio/speech (optimum-cli export openvino --model microsoft/speecht5_tts --model-kwargs"
        ' \'{"vocoder": "microsoft/speecht5_hifigan"}\' FOLDER)',
    )
    speech_voices: str | None = Field(
        None,
        description="folder of speaker embeddings a speech model speaks in, NAME.bin (raw float32) or NAME.npy,"
        " each a voice clients name (default: the model folder's voices/)",
    )
    speech_max_requests: int = Field(
        8,
        ge=0,
        description="speech requests a speech model takes at once, being spoken (a sentence a turn each) or"
        " waiting; a request holds its place until its last sentence is spoken; beyond them requests get 429",
    )
    encoder_preload: bool = Field(
        False,
        description="load the embedding, rerank, transcription and speech models at start, not on their first request",
    )
    encoder_device: str | None = Field(
        None, description="device of the embedding, rerank, transcription and speech models (default: device)"
    )
    encoder_inference_precision: Literal["auto", "f32", "bf16", "f16"] = Field(
        "auto",
        description="precision the embedding, rerank, transcription and speech models compute in (auto: the"
        " device's choice)",
    )
    audio_max_bytes: int = Field(
        25 * 1024 * 1024,
        ge=1024,
        description="largest audio file a transcription or translation request may upload, in bytes (the request"
        " body may be this plus 64 KiB when a transcription model is served); larger ones get 413",
    )
    audio_max_seconds: float = Field(
        1800.0,
        gt=0,
        description="longest audio a transcription or translation request may carry, in seconds (a file that"
        " declares or decodes to more gets 400); it bounds the model's work for one request: one 30 s window each",
    )
    audio_decodes: int = Field(
        2, ge=1, description="audio files decoded at once (each in a worker thread); more requests wait their turn"
    )
    audio_max_queued_requests: int = Field(
        8,
        ge=0,
        description="transcription and translation requests waiting for their model (each holds its decoded audio,"
        " 32 KB a second); beyond them requests get 429",
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
    encoder_max_request_tokens: int = Field(
        65536,
        ge=1,
        description="most tokens one embeddings or rerank request may have computed (its inputs, or its query and"
        " document pairs, each counted at most what it is cut to); a request with more gets 400 naming input or"
        " documents before any is computed",
    )
    response_store_size: int = Field(1000, ge=0, description="stored responses kept for retrieval and chaining")
    response_store_ttl: float = Field(3600.0, gt=0, description="seconds a stored response is kept")
    response_store_bytes: int = Field(
        64 * 1024 * 1024,
        ge=0,
        description="bytes of memory the stored responses may take (oldest dropped first), beside response_store_size",
    )
    max_body_bytes: int = Field(
        2 * 1024 * 1024,
        ge=1024,
        description="largest request body in bytes; larger ones get 413 (raised while a vision-language model"
        " or a Whisper model is served: room for --max-images-per-request images, or one --audio-max-bytes file)",
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
    grammar_compile_seconds: float = Field(
        2.0,
        gt=0,
        description="CPU seconds one output constraint (JSON schema, forced tool call) may take to compile,"
        " checked before the request is admitted; one that takes longer gets 400 naming the parameter",
    )
    response_store_path: str | None = Field(
        None, description="SQLite file that keeps stored responses across restarts (default: memory only)"
    )
    api_key: list[str] = Field(
        default_factory=list,
        description="key clients must send as 'Authorization: Bearer <key>' (repeat the flag for several; the"
        " environment variable holds one); with any key set, every route but the health probes (and /metrics,"
        " unless protect_metrics) needs one",
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
    playground: bool = Field(True, description="serve the browser playground at / (--no-playground leaves / a 404)")
    host: str = Field(
        "127.0.0.1",
        description="address to listen on (any but a loopback address, without an API key, logs a warning)",
    )
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


class Settings(ServerSettings, ModelSettings):
    """Everything the server runs with: the server's settings and (the defaults of) its
    models'. With a config file, each model gets a `Settings` of its own, these values
    overridden by its entry (ovtrio.settings.config_file.model_settings)."""

    model_config = ConfigDict(extra="forbid")


def in_data_dir(settings: Settings, path: str | None) -> str | None:
    """`path` as the server opens it: a relative path is taken in data_dir, when that is set."""
    if path is None or settings.data_dir is None or os.path.isabs(os.path.expanduser(path)):
        return path
    return os.path.join(os.path.expanduser(settings.data_dir), path)


class SettingsError(ValueError):
    """A setting could not be parsed; the message names it."""


def settings_from_env(environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Build settings from OVTRIO_* variables, with explicit overrides taking precedence."""
    from ovtrio.settings.sources import environment_values  # pydantic-settings: only when settings are read

    values = environment_values(os.environ if environ is None else environ)
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
