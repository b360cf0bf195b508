"""Prompts refused by size before they are tokenized, and long ones tokenized off the
event loop.

A prompt of N tokens has at most N x (the vocabulary's longest token) characters, so a
text longer than the context times that is refused at once (400 naming the field),
without spending the CPU to count its tokens, which for a body of megabytes holds the
event loop for seconds (see
docs/benchmarks.md#attacks-huge-inputs-cache-growth-closed-sockets). A text under the
bound gets the tokens it would get without one, a long one in a worker thread. The
tokenizer holds the GIL while it runs, so the thread alone does not free the event
loop: what does is that the tokenizer is called on pieces of bounded size
(ovtrio/text/prompts.py hands the GIL over between them) and that the whole text is
bounded here.

The request body itself is bounded by --max-body-bytes (a 413, checked by Quart before
the body is read), which also bounds how long parsing its JSON can take.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

import trio

from ovtrio.api.errors import invalid
from ovtrio.api.protocol import ChatMessage
from ovtrio.serving.service import ServingModel

T = TypeVar("T")

# Shorter texts tokenize in well under a millisecond: a thread would cost more.
OFF_LOOP_CHARS = 8192
# Tokenizations running at once in worker threads (they share the GIL anyway).
_TOKENIZING = trio.CapacityLimiter(2)


def max_prompt_chars(model: ServingModel) -> int:
    """The most characters one prompt can have and still fit the model's context."""
    return model.sequence_limit.tokens * model.prompts.longest_token_chars


def check_prompt_chars(model: ServingModel, texts: Iterable[str], param: str) -> int:
    """Refuse a prompt whose texts cannot fit the context whatever they say; their
    characters otherwise."""
    chars = sum(len(text) for text in texts)
    limit = max_prompt_chars(model)
    if chars > limit:
        raise invalid(
            f"Invalid value for '{param}': the prompt has {chars} characters, more than the {limit} that"
            f" {model.sequence_limit.tokens} tokens (this model's context) can hold at"
            f" {model.prompts.longest_token_chars} characters a token at most.",
            param,
            "context_length_exceeded",
        )
    return chars


def message_texts(messages: Iterable[ChatMessage]) -> Iterable[str]:
    for message in messages:
        yield message.text()
        for call in message.tool_calls or ():
            yield call.function.arguments


async def tokenized(chars: int, encode: Callable[..., T], *args: object, **kwargs: object) -> T:
    """`encode(*args, **kwargs)`: in a worker thread when the text is long."""
    if chars <= OFF_LOOP_CHARS:
        return encode(*args, **kwargs)
    return await trio.to_thread.run_sync(lambda: encode(*args, **kwargs), limiter=_TOKENIZING)
