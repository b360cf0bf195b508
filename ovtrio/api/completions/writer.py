"""Completion objects written from output events: `text_completion` chunks as a stream
goes, and the unary body from the aggregated outcome."""

from __future__ import annotations

from typing import Any

from ovtrio.api.chunks import Envelope
from ovtrio.output import ChoiceFinished, Outcome, OutputEvent, PromptScored, TextDelta, TokenLogprob
from ovtrio.scheduler import Completed, Failed

OBJECT = "text_completion"


def prompt_logprobs_body(entries: list[TokenLogprob], top: int) -> list[dict[str, Any] | None]:
    """vLLM's `prompt_logprobs`: per prompt token, {token id: {logprob, rank,
    decoded_token}} for the token itself, then for the `top` most likely tokens (ranks 1
    to top; the token itself once if it is among them); None for the first token."""
    body: list[dict[str, Any] | None] = []
    for entry in entries:
        if entry.logprob is None:
            body.append(None)
            continue
        scores = {str(entry.token_id): {"logprob": entry.logprob, "rank": entry.rank, "decoded_token": entry.text}}
        for rank, alternative in enumerate((entry.top or [])[:top], start=1):
            scores.setdefault(
                str(alternative.token_id),
                {"logprob": alternative.logprob, "rank": rank, "decoded_token": alternative.text},
            )
        body.append(scores)
    return body


class CompletionWriter:
    """`echo` is the text of each prompt (choice i belongs to prompt i // n).

    When the engine scores the prompt (`scored`), each choice's echo goes out with its
    scores, in the choice's first chunk: with `echo` and `logprobs` the logprobs cover the
    prompt's tokens (the first one's null, as in OpenAI's legacy API) and then the
    completion's; `prompt_logprobs` adds vLLM's field of that name.
    """

    def __init__(
        self,
        envelope: Envelope,
        *,
        choices: int,
        n: int = 1,
        echo: list[str] | None = None,
        logprobs: bool = False,
        top_logprobs: int = 0,
        prompt_logprobs: int | None = None,
        scored: bool = False,
    ) -> None:
        self.envelope = envelope
        self.choices = choices
        self.n = n
        self.echo = echo
        self.logprobs = logprobs
        self.top_logprobs = top_logprobs
        self.prompt_logprobs = prompt_logprobs
        self.scored = scored
        self._offsets: dict[int, int] = {}  # text offset of each choice's next token

    def _echo_text(self, index: int) -> str:
        return self.echo[index // self.n] if self.echo else ""

    def _choice(self, index: int, text: str, logprobs: Any, reason: str | None) -> dict[str, Any]:
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}

    def _logprobs(self, index: int, logprobs: list[TokenLogprob] | None) -> dict[str, Any] | None:
        if logprobs is None:
            return None
        offset = self._offsets.get(index, len(self._echo_text(index)))
        body = _legacy_logprobs(logprobs, offset, self.top_logprobs)
        self._offsets[index] = offset + sum(len(entry.text) for entry in logprobs)
        return body

    def _echoed(self, event: PromptScored) -> dict[str, Any]:
        """A choice's first chunk when the prompt was scored: its echo and the scores."""
        logprobs = _legacy_logprobs(event.logprobs, 0, self.top_logprobs) if self.echo and self.logprobs else None
        choice = self._choice(event.choice, self._echo_text(event.choice), logprobs, None)
        if self.prompt_logprobs is not None:
            choice["prompt_logprobs"] = prompt_logprobs_body(event.logprobs, self.prompt_logprobs)
        return choice

    def opening(self) -> list[dict[str, Any]]:
        if not self.echo or self.scored:
            return []
        return [
            self.envelope.wrap(OBJECT, [self._choice(i, self._echo_text(i), None, None)]) for i in range(self.choices)
        ]

    def write(self, events: list[OutputEvent]) -> list[dict[str, Any]]:
        chunks = []
        for event in events:
            if isinstance(event, TextDelta):
                choice = self._choice(event.choice, event.text, self._logprobs(event.choice, event.logprobs), None)
                chunks.append(self.envelope.wrap(OBJECT, [choice]))
            elif isinstance(event, PromptScored):
                chunks.append(self.envelope.wrap(OBJECT, [self._echoed(event)]))
            elif isinstance(event, ChoiceFinished):
                chunks.append(self.envelope.wrap(OBJECT, [self._choice(event.choice, "", None, event.reason)]))
            elif isinstance(event, (Completed, Failed)):
                chunks += self.envelope.closing(OBJECT, event)
        return chunks

    def completion(self, outcome: Outcome) -> dict[str, Any]:
        choices = []
        for i, result in enumerate(outcome.choices):
            entries = result.logprobs or []
            if self.echo and self.scored:
                entries = (result.prompt_logprobs or []) + entries
            offset = 0 if self.scored else len(self._echo_text(i))
            logprobs = _legacy_logprobs(entries, offset, self.top_logprobs) if self.logprobs else None
            choice = self._choice(i, self._echo_text(i) + result.text, logprobs, result.finish_reason)
            if self.prompt_logprobs is not None:
                choice["prompt_logprobs"] = prompt_logprobs_body(result.prompt_logprobs or [], self.prompt_logprobs)
            choices.append(choice)
        return self.envelope.unary(OBJECT, choices, outcome.usage)


def _legacy_logprobs(entries: list[TokenLogprob], offset: int, top: int) -> dict[str, Any]:
    """OpenAI's legacy logprobs object for `entries`, the first starting at `offset` in the
    choice's text. Each `top_logprobs` entry holds the `top` most likely tokens at that
    position, most likely first, whether or not the chosen token is among them (its own
    figure is in `token_logprobs`); null where the token has no log-probability (a
    prompt's first), and {} when no alternatives were asked for (`logprobs: 0`)."""
    tokens, offsets = [], []
    for entry in entries:
        tokens.append(entry.text)
        offsets.append(offset)
        offset += len(entry.text)
    values = [entry.logprob for entry in entries]
    return {
        "tokens": tokens,
        "token_logprobs": values,
        "top_logprobs": [
            None if entry.logprob is None else {t.text: t.logprob for t in (entry.top or [])[:top]} for entry in entries
        ],
        "text_offset": offsets,
    }
