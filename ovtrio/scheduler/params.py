"""What the scheduler needs to run one request, and the one place that turns it into an
OpenVINO GenAI GenerationConfig."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SamplingParams:
    """Decoding settings for one request, already validated by the caller.

    `temperature == 0` means greedy decoding. `stop` strings are matched on the decoded
    text by the scheduler (not by the engine), so the cut is exact to the character and
    the same for streamed and unary output.
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    skip_special_tokens: bool = True

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class GenerationRequest:
    """A tokenized prompt plus its sampling settings."""

    prompt_ids: list[int]
    params: SamplingParams
    # Free-form labels for logs and metrics (endpoint, ...); never read by the scheduler.
    labels: dict[str, Any] = field(default_factory=dict)


def to_generation_config(params: SamplingParams) -> Any:
    """Build the engine's GenerationConfig for `params`.

    End-of-sequence ids are not set here: the pipeline adds the model's own on add_request.
    """
    import openvino_genai

    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = params.max_new_tokens
    config.ignore_eos = params.ignore_eos
    config.num_return_sequences = 1
    config.num_beams = 1
    if params.greedy:
        config.do_sample = False
        config.temperature = 0.0
    else:
        config.do_sample = True
        config.temperature = params.temperature
        config.top_p = params.top_p
        if params.top_k is not None and params.top_k > 0:
            config.top_k = params.top_k
        if params.seed is not None:
            config.rng_seed = params.seed
    return config
