"""Typed messages the scheduler sends on each request's channel.

A request's channel carries any number of `Delta`s, then exactly one `Completed` or
`Failed`, then closes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Delta:
    """New output of sequence `index`. `finish_reason` is set on the sequence's last delta:
    "stop" (end of sequence or a stop string) or "length" (max_new_tokens reached)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None


@dataclass(frozen=True, slots=True)
class Completed:
    """Every sequence has finished; token counts for usage reporting."""

    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class Failed:
    """The engine could not finish the request. `code` is machine-readable:
    "out_of_memory" (KV cache cannot hold it) or "engine_error"."""

    message: str
    code: str


Message = Delta | Completed | Failed
