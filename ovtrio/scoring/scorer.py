"""The scoring path as the API uses it: asynchronous, admitted like generation.

A scoring request takes running places in the scheduler (one per sequence scored) for
as long as it runs, so generation and scoring share one admission: a burst of scoring
requests waits in the same queue, and is refused with the same 429, as a burst of
generation requests would be. The model is compiled on the first scoring request (a
server that never scores never pays its memory), then sequences are scored one at a
time, a chunk per worker-thread call, so the event loop never waits on inference and a
request whose client left stops at the next chunk.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import trio

from ovtrio.scoring.engine import ScoringEngine, SequenceScores

log = logging.getLogger("ovtrio")

Reserve = Callable[[int], AbstractAsyncContextManager[Any]]


class ScoringUnavailable(Exception):
    """The scoring path cannot run for this model; the message says why."""


class Scorer:
    def __init__(self, load: Callable[[], ScoringEngine] | None, reserve: Reserve, unavailable: str = "") -> None:
        """`load` builds the engine (blocking; None: scoring cannot run, `unavailable`
        says why); `reserve(places)` holds running places in the scheduler."""
        self._load = load
        self._reserve = reserve
        self._unavailable = unavailable
        self._engine: ScoringEngine | None = None
        self._lock = trio.Lock()  # one infer request: one sequence at a time

    @property
    def available(self) -> bool:
        return self._load is not None

    @property
    def loaded(self) -> bool:
        return self._engine is not None

    async def score(self, sequences: list[list[int]], top: int) -> list[SequenceScores]:
        """Each sequence's scores, with the `top` most likely tokens of each position.
        Raises ScoringUnavailable, or the scheduler's Overloaded / NotAccepting."""
        if self._load is None:
            raise ScoringUnavailable(self._unavailable)
        distinct = list(dict.fromkeys(tuple(ids) for ids in sequences))
        async with self._reserve(len(distinct)), self._lock:
            engine = await self._loaded_engine()
            scored: dict[tuple[int, ...], SequenceScores] = {}
            for ids in distinct:
                run = engine.start(list(ids), top)
                while not run.done:
                    await trio.to_thread.run_sync(run.step)
                scored[ids] = run.result()
        return [scored[tuple(ids)] for ids in sequences]

    async def _loaded_engine(self) -> ScoringEngine:
        if self._engine is None:
            assert self._load is not None
            try:
                self._engine = await trio.to_thread.run_sync(self._load)
            except Exception as exc:  # the model cannot be compiled for scoring: say why, once
                log.exception("the scoring model could not be loaded")
                self._load = None
                self._unavailable = f"the scoring model could not be loaded: {str(exc).splitlines()[0]}"
                raise ScoringUnavailable(self._unavailable) from None
            log.info("scoring model loaded")
        return self._engine
