"""Plain OpenVINO inference of the scoring model (graph.py) over one token sequence.

The IR is the one the engine serves (an IR folder's `openvino_model.xml`, or what the
model cache converted from a GGUF file): stateful, its KV cache in variables that
persist between inferences of one infer request. A sequence is run in chunks of at most
`chunk_tokens` positions, each continuing the state of the one before, and the state is
reset before each sequence and after it (so an idle scorer holds no KV cache). Chunks
bound the memory of one inference (the log-softmax over a chunk is chunk x vocabulary
floats: 50 MB for 256 positions of the embedded model) and give the caller a point
between chunks to stop at. Like the engine's own chunked prefill, a chunk boundary moves
log-probabilities by rounding (dynamic quantization groups, bf16), not more.

`infer()` releases the GIL: run in a worker thread, the event loop goes on (measured:
docs/benchmarks.md#scoring-inference).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ovtrio.scoring.graph import MAX_TOP_LOGPROBS, OUTPUTS, scoring_model

log = logging.getLogger("ovtrio")

__all__ = ["MAX_TOP_LOGPROBS", "ScoringEngine", "SequenceRun", "SequenceScores"]


@dataclass(frozen=True)
class SequenceScores:
    """Per token of a sequence, what the model gave it from the tokens before it (entry
    0, the first token, has no context: NaN and rank 0). `ranks` are 1-based (1: the most
    likely token); `top_ids` / `top_logprobs` hold the `top` most likely tokens, most
    likely first."""

    token_ids: list[int]
    logprobs: np.ndarray  # [n] float32
    ranks: np.ndarray  # [n] int
    top_ids: np.ndarray  # [n, top] int64
    top_logprobs: np.ndarray  # [n, top] float32

    def logprob(self, position: int) -> float | None:
        return None if position == 0 else float(self.logprobs[position])

    def top(self, position: int) -> list[tuple[int, float]]:
        """The most likely tokens at `position`: (token id, log-probability), best first."""
        if position == 0:
            return []
        return [(int(i), float(v)) for i, v in zip(self.top_ids[position], self.top_logprobs[position])]


class ScoringEngine:
    """The compiled scoring model and one infer request: one sequence at a time."""

    def __init__(self, model_xml: Path, device: str, properties: dict[str, Any], chunk_tokens: int = 256) -> None:
        """Blocking: reads and compiles the model (seconds; the GIL is released)."""
        import openvino as ov

        core = ov.Core()
        model = scoring_model(core.read_model(str(model_xml)))
        self._inputs = {port.get_any_name() for port in model.inputs}
        self._compiled = core.compile_model(model, device, properties)
        self._request = self._compiled.create_infer_request()
        self.chunk_tokens = chunk_tokens

    def start(self, token_ids: list[int], top: int) -> SequenceRun:
        """A run over `token_ids`, reading the `top` most likely tokens of each position."""
        self._request.reset_state()
        return SequenceRun(self, list(token_ids), min(top, MAX_TOP_LOGPROBS))

    def score(self, token_ids: list[int], top: int) -> SequenceScores:
        """The whole sequence at once (blocking)."""
        run = self.start(token_ids, top)
        while not run.done:
            run.step()
        return run.result()

    def _infer(self, token_ids: list[int], start: int, end: int) -> list[np.ndarray]:
        chunk = np.asarray([token_ids[start:end]], dtype=np.int64)
        targets = token_ids[start + 1 : end + 1]
        targets += [0] * (end - start - len(targets))  # the last position predicts nothing we read
        feeds = {"input_ids": chunk, "target_ids": np.asarray([targets], dtype=np.int64)}
        if "attention_mask" in self._inputs:
            feeds["attention_mask"] = np.ones((1, end), dtype=np.int64)
        if "position_ids" in self._inputs:
            feeds["position_ids"] = np.arange(start, end, dtype=np.int64)[None]
        if "beam_idx" in self._inputs:
            feeds["beam_idx"] = np.zeros(1, dtype=np.int32)
        self._request.infer(feeds)
        return [self._request.get_tensor(name).data[0].copy() for name in OUTPUTS]

    def _release(self) -> None:
        self._request.reset_state()


class SequenceRun:
    """One sequence, scored a chunk per `step()` (each blocking, GIL released)."""

    def __init__(self, engine: ScoringEngine, token_ids: list[int], top: int) -> None:
        self._engine = engine
        self._ids = token_ids
        self._top = top
        self._done_to = 0
        self._parts: list[list[np.ndarray]] = []

    @property
    def done(self) -> bool:
        return self._done_to >= len(self._ids)

    def step(self) -> None:
        start = self._done_to
        end = min(len(self._ids), start + self._engine.chunk_tokens)
        self._parts.append(self._engine._infer(self._ids, start, end))
        self._done_to = end
        if self.done:
            self._engine._release()

    def result(self) -> SequenceScores:
        top_values, top_ids, token_logprob, rank = (np.concatenate(column) for column in zip(*self._parts))
        # Position p's outputs score token p + 1: shift them onto the token they score.
        n = len(self._ids)
        logprobs = np.full(n, np.nan, dtype=np.float32)
        ranks = np.zeros(n, dtype=np.int64)
        tops = np.zeros((n, self._top), dtype=np.int64)
        top_logprobs = np.zeros((n, self._top), dtype=np.float32)
        logprobs[1:] = token_logprob[: n - 1, 0]
        ranks[1:] = rank[: n - 1, 0] + 1
        tops[1:] = top_ids[: n - 1, : self._top]
        top_logprobs[1:] = top_values[: n - 1, : self._top]
        return SequenceScores(self._ids, logprobs, ranks, tops, top_logprobs)
