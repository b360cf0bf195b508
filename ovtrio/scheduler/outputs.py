"""Typed outputs the scheduler sends on each request's channel (RequestOutput).

A request's channel carries any number of `Delta`s, then exactly one `Completed` or
`Failed`, then closes. (Scored prompts come from the scoring path, ovtrio/scoring.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Failed.code of a reply that held a token id outside the model's vocabulary.
TOKEN_OUTSIDE_VOCABULARY = "token_outside_vocabulary"


@dataclass(slots=True)
class Delta:
    """New output of choice `index`. `finish_reason` is set on the choice's last delta:
    "stop" (end of sequence, stop string or stop token) or "length" (max_new_tokens),
    and `stop` then names the stop string that ended it, if one did (vLLM's
    stop_reason). `logprobs` holds one log-probability per id in `token_ids` when they
    were asked for."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    logprobs: list[float] | None = None
    stop: str | None = None


@dataclass(frozen=True, slots=True)
class RequestTimings:
    """When a request's stages ended, in seconds since it was submitted (as the
    RequestObserver measures them): taken into the engine (`added`), its first token
    read (`first_token`), its last token read (`last_token`). None for a stage it did
    not reach (a request that generated nothing has no first token)."""

    added: float | None
    first_token: float | None
    last_token: float | None


@dataclass(frozen=True, slots=True)
class Completed:
    """Every choice has finished; token counts for usage reporting, and the request's
    timings where the scheduler measured them."""

    prompt_tokens: int
    completion_tokens: int
    # Not compared: two runs of one request match in what they produced, not in how long it took.
    timings: RequestTimings | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Failed:
    """The engine could not finish the request. `code` is machine-readable:
    "out_of_memory" (KV cache cannot hold it), "engine_error", TOKEN_OUTSIDE_VOCABULARY
    (the model produced an id its detokenizer has no text for), or "shutting_down" (the
    server stopped before the request ended)."""

    message: str
    code: str


RequestOutput = Delta | Completed | Failed
