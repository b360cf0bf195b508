"""Completion objects written from output events: `text_completion` chunks as a stream
goes, and the unary body from the aggregated outcome."""

from __future__ import annotations

from typing import Any

from ovtrio.api.chunks import Envelope
from ovtrio.output import ChoiceFinished, Outcome, OutputEvent, TextDelta, TokenLogprob
from ovtrio.scheduler import Completed, Failed

OBJECT = "text_completion"


class CompletionWriter:
    """`echo` is the text of each prompt (choice i belongs to prompt i // n)."""

    def __init__(
        self, envelope: Envelope, *, choices: int, n: int = 1, echo: list[str] | None = None, logprobs: bool = False
    ) -> None:
        self.envelope = envelope
        self.choices = choices
        self.n = n
        self.echo = echo
        self.logprobs = logprobs
        self._offsets: dict[int, int] = {}  # text offset of each choice's next token

    def _echo_text(self, index: int) -> str:
        return self.echo[index // self.n] if self.echo else ""

    def _choice(self, index: int, text: str, logprobs: Any, reason: str | None) -> dict[str, Any]:
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}

    def _logprobs(self, index: int, logprobs: list[TokenLogprob] | None) -> dict[str, Any] | None:
        if logprobs is None:
            return None
        offset = self._offsets.get(index, len(self._echo_text(index)))
        tokens, offsets = [], []
        for entry in logprobs:
            token = entry.text
            tokens.append(token)
            offsets.append(offset)
            offset += len(token)
        self._offsets[index] = offset
        values = [entry.logprob for entry in logprobs]
        return {
            "tokens": tokens,
            "token_logprobs": values,
            # The engine reports the chosen token only; it stands as its own top entry.
            "top_logprobs": [{token: logprob} for token, logprob in zip(tokens, values)],
            "text_offset": offsets,
        }

    def opening(self) -> list[dict[str, Any]]:
        if not self.echo:
            return []
        return [self.envelope.wrap(OBJECT, [self._choice(i, self._echo_text(i), None, None)]) for i in range(self.choices)]

    def write(self, events: list[OutputEvent]) -> list[dict[str, Any]]:
        chunks = []
        for event in events:
            if isinstance(event, TextDelta):
                choice = self._choice(event.choice, event.text, self._logprobs(event.choice, event.logprobs), None)
                chunks.append(self.envelope.wrap(OBJECT, [choice]))
            elif isinstance(event, ChoiceFinished):
                chunks.append(self.envelope.wrap(OBJECT, [self._choice(event.choice, "", None, event.reason)]))
            elif isinstance(event, (Completed, Failed)):
                chunks += self.envelope.closing(OBJECT, event)
        return chunks

    def completion(self, outcome: Outcome) -> dict[str, Any]:
        choices = [
            self._choice(
                i,
                self._echo_text(i) + result.text,
                self._logprobs(i, result.logprobs or []) if self.logprobs else None,
                result.finish_reason,
            )
            for i, result in enumerate(outcome.choices)
        ]
        return self.envelope.unary(OBJECT, choices, outcome.usage)
