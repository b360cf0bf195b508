"""Ollama's `options`, as this server honours them: each option either becomes the
sampling field chat completions takes, or is accepted and ignored (what it tunes does
not exist here), or is refused with a 400 naming it. Unknown options are ignored, as
Ollama ignores them.

Honoured: num_predict (max_tokens; 0 or negative: no limit but the context's),
temperature, top_k, top_p, min_p, repeat_penalty (repetition_penalty),
presence_penalty, frequency_penalty, seed, stop. Ollama's defaults for the options left
out (temperature 0.8, repeat_penalty 1.1, ...) are not applied: the model's own
generation config decides, as on every other route.

Accepted and ignored: num_ctx (the context is the model's, fixed when it loads; a prompt
that does not fit is refused, never cut), num_keep and repeat_last_n (the engine
penalizes repeats over the whole sequence, and never shifts the context), and the
runner's: num_batch, num_gpu, main_gpu, use_mmap, num_thread, numa, low_vram, f16_kv,
logits_all, vocab_only, use_mlock.

This server's own, which Ollama ignores as an unknown option: tool_choice ("auto",
"none", "required" or the name of a tool), chat completions' tool_choice: a client that
must have a call asks for one.

Refused unless they leave sampling as it is: typical_p (1.0), tfs_z (1.0), mirostat
(0), penalize_newline (false): the engine has no such samplers.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from ovtrio.api.errors import invalid
from ovtrio.api.protocol import Body


def _whole(value: Any) -> Any:
    """An integer option sent as a whole float (Go's JSON reader gives every number as
    one, and Ollama takes 5.0 for 5)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Int = Annotated[int, BeforeValidator(_whole)]
Number = float  # strict: an int is a float (pydantic's strict mode takes 1 for 1.0)

# Options honoured: the sampling field each one becomes.
SAMPLING = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "repeat_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "seed": "seed",
    "stop": "stop",
}

# Samplers the engine lacks, and the value that leaves them out.
_NEUTRAL = {"typical_p": 1.0, "tfs_z": 1.0, "mirostat": 0, "penalize_newline": False}


class Options(Body):
    """The `options` object; unknown options are ignored (Body ignores extra fields)."""

    num_predict: Int | None = None
    temperature: Number | None = None
    top_k: Int | None = None
    top_p: Number | None = None
    min_p: Number | None = None
    repeat_penalty: Number | None = None
    presence_penalty: Number | None = None
    frequency_penalty: Number | None = None
    seed: Int | None = None
    stop: list[Annotated[str, Field(min_length=1)]] | None = None
    # This server's: chat completions' tool_choice ("auto", "none", "required" or a
    # tool's name), which Ollama lacks (and ignores, as an unknown option).
    tool_choice: Annotated[str, Field(min_length=1)] | None = None
    # Accepted and ignored (see the module's docstring), type-checked all the same.
    num_ctx: Int | None = None
    num_keep: Int | None = None
    repeat_last_n: Int | None = None
    num_batch: Int | None = None
    num_gpu: Int | None = None
    main_gpu: Int | None = None
    num_thread: Int | None = None
    use_mmap: bool | None = None
    numa: bool | None = None
    low_vram: bool | None = None
    f16_kv: bool | None = None
    logits_all: bool | None = None
    vocab_only: bool | None = None
    use_mlock: bool | None = None
    # Refused unless neutral.
    typical_p: Number | None = None
    tfs_z: Number | None = None
    mirostat: Int | None = None
    penalize_newline: bool | None = None

    def sampling_fields(self) -> dict[str, Any]:
        """The chat completions fields these options set; raises a 400 for an option
        the engine cannot honour."""
        for name, neutral in _NEUTRAL.items():
            value = getattr(self, name)
            if value is not None and value != neutral:
                raise invalid(
                    f"Invalid value for 'options.{name}': this server's engine has no such sampler; leave it out"
                    f" (or {str(neutral).lower()}).",
                    f"options.{name}",
                    "unsupported_parameter",
                )
        fields: dict[str, Any] = {}
        if self.num_predict is not None and self.num_predict > 0:
            fields["max_tokens"] = self.num_predict
        for option, field in SAMPLING.items():
            value = getattr(self, option)
            if value is not None:
                fields[field] = value
        if self.seed is not None and self.seed < 0:
            del fields["seed"]  # Ollama's -1: a random seed, as no seed is
        if self.stop == []:
            del fields["stop"]
        return fields


# Chat completions' names of the fields options set, and the options they came from:
# errors name what the client sent.
OPTION_OF = {"max_tokens": "options.num_predict", **{field: f"options.{o}" for o, field in SAMPLING.items()}}
