"""Refusing what the serving model's engine backend cannot do (ovtrio/engine/backend.py):
a 400 naming the field, before anything is generated."""

from __future__ import annotations

from ovtrio.api.errors import invalid
from ovtrio.api.protocol import SamplingFields
from ovtrio.engine.backend import Capabilities
from ovtrio.scheduler import OutputConstraint

_BACKEND = "this server's stateful engine backend"


def check_capabilities(capabilities: Capabilities, body: SamplingFields, prompts: int) -> None:
    """Raise the 400 for the first field of the request that `capabilities` rule out;
    `prompts` is how many prompts it has. Checked before the prompts are tokenized."""
    what = _BACKEND if capabilities.backend == "stateful" else "this server"
    if not capabilities.several_choices:
        if body.n > 1:
            raise invalid(
                f"Invalid value for 'n': {what} makes one choice per request; n must be 1.",
                "n",
                "unsupported_parameter",
            )
        if prompts > 1:
            raise invalid(
                f"Invalid value for 'prompt': {what} takes one prompt per request.", "prompt", "unsupported_parameter"
            )
    if not capabilities.beam_search and body.beam_width() > 1:
        raise invalid(f"best_of > 1 (beam search) is not supported by {what}.", "best_of", "unsupported_parameter")
    if not capabilities.prompt_logprobs and body.scores_prompt():
        param = "prompt_logprobs" if getattr(body, "prompt_logprobs", None) is not None else "echo"
        if param == "echo" and body.wants_logprobs():
            param = "logprobs"
        raise invalid(f"Scoring the prompt ({param}) is not supported by {what}.", param, "unsupported_parameter")
    if not capabilities.logprobs and body.wants_logprobs():
        raise invalid(f"Log-probabilities (logprobs) are not supported by {what}.", "logprobs", "unsupported_parameter")


def check_constraint(capabilities: Capabilities, body: SamplingFields, constraint: OutputConstraint | None) -> None:
    """Refuse an output constraint the backend cannot enforce."""
    what = _BACKEND if capabilities.backend == "stateful" else "this server"
    if not capabilities.structured_output and constraint is not None:
        param = "tool_choice" if getattr(body, "tool_choice", None) not in (None, "auto", "none") else "response_format"
        if getattr(body, "text", None) is not None and param == "response_format":
            param = "text"  # the Responses API's field
        raise invalid(f"Constrained output ({param}) is not supported by {what}.", param, "unsupported_parameter")


def check_prompt_length(capabilities: Capabilities, body: SamplingFields, prompts: list[list[int]]) -> None:
    """Refuse a prompt longer than the backend takes (max_prompt_len), before the device sees it."""
    limit = capabilities.max_prompt_tokens
    longest = max(len(p) for p in prompts)
    if limit is not None and longest > limit:
        raise invalid(
            f"This server takes prompts of at most {limit} tokens (its max_prompt_len), but the prompt is"
            f" {longest} tokens. Please shorten the prompt, or start the server with a larger --max-prompt-len.",
            body.prompt_field,
            "context_length_exceeded",
        )
