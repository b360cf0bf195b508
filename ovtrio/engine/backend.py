"""Which engine backend serves the model, how its pipeline is built, and what it can do.

- continuous_batching: OpenVINO GenAI's ContinuousBatchingPipeline; ovtrio's scheduler
  steps many requests together (CPU, GPU).
- stateful: OpenVINO GenAI's LLMPipeline, one request at a time (scheduler/stateful.py);
  the only pipeline the NPU runs. On NPU the model is compiled for a fixed longest prompt
  (MAX_PROMPT_LEN) plus room for the reply (MIN_RESPONSE_LEN), OVMS's NPU settings, with
  OVMS's defaults 1024 and 128. Elsewhere LLMPipeline would pick the continuous-batching
  engine by itself; the SDPA attention backend keeps it the stateful one the NPU runs.

The stateful pipeline streams one sequence: no n > 1, no beam search (it refuses a
streamer with beams), no per-token log-probabilities (it reports only a cumulative
score) and no prompt scoring (it refuses echo). Constrained decoding runs in its sampler
on every device (it has no check against it, and it was seen working on CPU).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from ovtrio.settings.server import Settings

Backend = Literal["continuous_batching", "stateful"]

# OVMS's and OpenVINO GenAI's defaults for the NPU's compiled lengths.
NPU_MAX_PROMPT_LEN = 1024
NPU_MIN_RESPONSE_LEN = 128


def is_npu(device: str) -> bool:
    return device.split(".")[0].split(":")[0].upper() == "NPU"


def engine_backend(settings: Settings) -> Backend:
    """The backend `settings` ask for; auto: stateful on NPU, continuous batching elsewhere."""
    if settings.backend != "auto":
        return settings.backend
    return "stateful" if is_npu(settings.device) else "continuous_batching"


def backend_conflict(settings: Settings) -> str | None:
    """Why `settings` cannot run on their backend, in one line; None if they can."""
    backend = engine_backend(settings)
    if backend == "continuous_batching" and is_npu(settings.device):
        return "the NPU runs only the stateful backend: drop --backend continuous_batching (auto picks stateful there)"
    if backend == "stateful":
        flag = "--prompt-lookup" if settings.prompt_lookup else "--draft-model" if settings.draft_model else None
        if flag:
            return (
                f"{flag} (speculative decoding) needs the continuous_batching backend; the stateful backend"
                " does not speculate"
            )
    return None


def max_prompt_len(settings: Settings) -> int | None:
    """The longest prompt the stateful backend takes (None: only the context limits it)."""
    if engine_backend(settings) != "stateful":
        return None
    if is_npu(settings.device):
        return settings.max_prompt_len or NPU_MAX_PROMPT_LEN
    return settings.max_prompt_len


def npu_context(settings: Settings) -> int | None:
    """The context the NPU model is compiled for (prompt + reply), or None off the NPU."""
    if engine_backend(settings) != "stateful" or not is_npu(settings.device):
        return None
    return (settings.max_prompt_len or NPU_MAX_PROMPT_LEN) + (settings.min_response_len or NPU_MIN_RESPONSE_LEN)


def stateful_properties(settings: Settings) -> dict[str, object]:
    """LLMPipeline properties of the stateful backend on `settings.device`."""
    if is_npu(settings.device):
        return {
            "MAX_PROMPT_LEN": settings.max_prompt_len or NPU_MAX_PROMPT_LEN,
            "MIN_RESPONSE_LEN": settings.min_response_len or NPU_MIN_RESPONSE_LEN,
        }
    return {"ATTENTION_BACKEND": "SDPA"}


@dataclass(frozen=True)
class Capabilities:
    """What the backend can do for a request beyond plain sampling; the API refuses the
    rest with a 400 naming the field, before anything is generated."""

    backend: Backend = "continuous_batching"
    several_choices: bool = True  # n > 1
    beam_search: bool = True  # best_of > 1
    logprobs: bool = True  # per-token log-probabilities
    prompt_logprobs: bool = True  # scored prompts (echo with logprobs, prompt_logprobs)
    structured_output: bool = True  # response_format, forced tool calls
    max_prompt_tokens: int | None = None  # None: only the context limits the prompt
    # Prompts the engine can take as token ids (a vision-language model's engine takes
    # text only, so prompts sent as ids, and scoring them, are refused).
    token_prompts: bool = True


def capabilities_for(settings: Settings, vision: bool = False) -> Capabilities:
    if vision:
        return replace(_backend_capabilities(settings), prompt_logprobs=False, token_prompts=False)
    return _backend_capabilities(settings)


def _backend_capabilities(settings: Settings) -> Capabilities:
    if engine_backend(settings) == "continuous_batching":
        return Capabilities()
    return Capabilities(
        backend="stateful",
        several_choices=False,
        beam_search=False,
        logprobs=False,
        prompt_logprobs=False,
        structured_output=True,
        max_prompt_tokens=max_prompt_len(settings),
    )
