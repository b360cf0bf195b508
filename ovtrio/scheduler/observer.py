"""What the scheduler tells an observer about each request, as it happens.

The scheduler measures; it does not keep histograms or know any metrics format. It
calls a RequestObserver at each point of a request's life, with the time since the
request was submitted (`Scheduler.submit`, after the API layer has tokenized and checked
it) or since its previous token. All times are seconds of `time.monotonic()`.

Everything is reported per choice (a Sequence: one per prompt and `n`, or per beam of a
beam search), as vLLM reports per engine request:

- `queued`: submission until the loop added the request to the engine, between two
  steps;
- `first_token`: submission until the first generated token was read off the engine
  (right after the step that produced it);
- `inter_token`: the time between two successive reads that brought the choice new
  tokens (one per engine step while it decodes);
- `finished`: the choice ended by itself ("stop": end of sequence, stop token or stop
  string; "length": max_tokens), with its prompt and generated token counts, the time
  from submission to its last token, and the mean time per generated token after the
  first (0 with fewer than two);
- `speculated`: an engine step verified `drafted` candidate tokens of a speculating
  choice and accepted `accepted` of them (speculation.py says how they are counted);
- `ended`: the choice was cut short: "abort" (its consumer left) or "error" (the
  engine failed it). Nothing else is measured for those.

Calls come from the scheduler's loop task, for every choice of every step, so they must
be cheap and must not block or raise.
"""

from __future__ import annotations

from typing import Protocol


class RequestObserver(Protocol):
    def queued(self, seconds: float) -> None: ...

    def first_token(self, seconds: float) -> None: ...

    def inter_token(self, seconds: float) -> None: ...

    def finished(
        self, reason: str, prompt_tokens: int, generation_tokens: int, e2e: float, time_per_output_token: float
    ) -> None: ...

    def speculated(self, drafted: int, accepted: int) -> None: ...

    def ended(self, reason: str) -> None: ...


class NoObserver:
    """Observes nothing (a scheduler without metrics)."""

    def queued(self, seconds: float) -> None:
        pass

    def first_token(self, seconds: float) -> None:
        pass

    def inter_token(self, seconds: float) -> None:
        pass

    def finished(
        self, reason: str, prompt_tokens: int, generation_tokens: int, e2e: float, time_per_output_token: float
    ) -> None:
        pass

    def speculated(self, drafted: int, accepted: int) -> None:
        pass

    def ended(self, reason: str) -> None:
        pass
