"""The bridge between the stateful pipeline's generating thread and the trio loop.

`LLMPipeline.generate()` runs in a worker thread and calls its streamer's `write()` on
that thread once per token. The streamer (TokenStreamer) appends the ids to a
GeneratedTokens buffer and, when the buffer was empty, asks trio to wake the loop
(`TrioToken.run_sync_soon`, which never waits for the event loop). The loop reads the
buffer through the same calls it uses on a continuous-batching handle (`can_read`,
`read`, `get_status`, `cancel`), so delivery.py's reading, detokenizing, stop strings
and deltas serve both backends unchanged.

Back-pressure: when the loop does not read (the request is paused because its consumer
lags, admission.py), the buffer fills to `limit` ids and `write()` then waits there, so
the engine pauses instead of buffering without bound; `cancel()` (the consumer left, a
stop string, the slow-reader timeout, shutdown) wakes it, and `write()` answers CANCEL.
The pipeline may produce a token after CANCEL; anything written after cancel() is dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Ids the buffer holds before the generating thread waits for the loop to read.
DEFAULT_LIMIT = 1024


@dataclass
class StreamedOutput:
    """What `read()` gives, in the shape of an engine GenerationOutput."""

    generated_ids: list[int]
    generated_log_probs: list[float]
    score: float
    finish_reason: Any


class GeneratedTokens:
    """The ids the generating thread wrote and the loop has not read; a stand-in for a
    GenerationHandle. Thread-safe."""

    def __init__(self, wake: Callable[[], None], limit: int = DEFAULT_LIMIT) -> None:
        """`wake()` is called from the generating thread when ids arrive in an empty
        buffer, and when generation ends; it must not block (run_sync_soon)."""
        import openvino_genai

        self._statuses = openvino_genai.GenerationStatus
        self._reasons = openvino_genai.GenerationFinishReason
        self._wake = wake
        self._limit = limit
        self._lock = threading.Condition()
        self._ids: list[int] = []
        self._finish_reason: Any = None  # set by finish(); then read once
        self._status = self._statuses.RUNNING
        self.cancelled = False
        self.written = 0  # ids accepted, ever

    # ---- the generating thread ----------------------------------------------------------

    def push(self, ids: list[int]) -> bool:
        """Add ids; False once cancelled (the streamer then answers CANCEL). Waits while
        the buffer is full and the request is not cancelled."""
        with self._lock:
            while not self.cancelled and len(self._ids) >= self._limit:
                self._lock.wait()
            if self.cancelled:
                return False
            was_empty = not self._ids
            self._ids.extend(ids)
            self.written += len(ids)
        if was_empty:
            self._wake()
        return True

    # ---- the loop (trio thread) ---------------------------------------------------------

    def finish(self, reason: str) -> None:
        """Generation returned: "stop" or "length" is the last output's finish reason."""
        with self._lock:
            self._finish_reason = self._reasons.LENGTH if reason == "length" else self._reasons.STOP
            self._status = self._statuses.FINISHED

    def can_read(self) -> bool:
        with self._lock:
            return bool(self._ids) or self._finish_reason is not None

    def read(self) -> dict[int, StreamedOutput]:
        with self._lock:
            ids, self._ids = self._ids, []
            reason, self._finish_reason = self._finish_reason, None
            self._lock.notify_all()
        return {0: StreamedOutput(ids, [], 0.0, reason if reason is not None else self._reasons.NONE)}

    def get_status(self) -> Any:
        with self._lock:
            return self._status

    def cancel(self) -> None:
        """Stop the generation at its next token; safe from any thread, more than once."""
        with self._lock:
            self.cancelled = True
            if self._status == self._statuses.RUNNING:
                self._status = self._statuses.CANCEL
            self._lock.notify_all()


def make_streamer(tokens: GeneratedTokens) -> Any:
    """An openvino_genai.StreamerBase that writes into `tokens`."""
    import openvino_genai

    running, cancel = openvino_genai.StreamingStatus.RUNNING, openvino_genai.StreamingStatus.CANCEL

    class TokenStreamer(openvino_genai.StreamerBase):
        def write(self, token: Any) -> Any:
            # One id, or a list of them (a speculating pipeline writes several).
            ids = [int(token)] if isinstance(token, int) else [int(t) for t in token]
            return running if tokens.push(ids) else cancel

        def end(self) -> None:
            pass

    return TokenStreamer()
