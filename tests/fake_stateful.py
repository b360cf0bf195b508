"""A small fake of OpenVINO GenAI's stateful LLMPipeline, for the one-at-a-time
scheduler's pure-logic tests: `generate()` writes "a", "b", "a", ... (tokens 1, 2) to its
streamer, one every `seconds_per_token`, until max_new_tokens or CANCEL, as the real
one does on its own thread."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import openvino_genai
import trio

from fake_engine import VOCABULARY, Observed
from ovtrio.scheduler import AdmissionLimits, StatefulScheduler


class FakeLLMPipeline:
    def __init__(self, seconds_per_token: float = 0.002) -> None:
        self.seconds_per_token = seconds_per_token
        self.failing = 0  # generate() calls that raise
        self.calls = 0
        self.cancelled = 0  # generations ended by the streamer's CANCEL
        self.written: list[int] = []  # tokens each generation wrote
        self.inside = 0  # generations running now (never more than one)
        self.most_inside = 0
        self._lock = threading.Lock()

    def get_generation_config(self) -> Any:
        return SimpleNamespace(stop_token_ids={0})

    def generate(self, prompt: Any, config: Any, streamer: Any) -> Any:
        with self._lock:
            self.calls += 1
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        try:
            if self.failing:
                self.failing -= 1
                raise RuntimeError("boom")
            written = 0
            reason = openvino_genai.GenerationFinishReason.LENGTH
            for i in range(config.max_new_tokens):
                time.sleep(self.seconds_per_token)
                written += 1
                if streamer.write(1 + i % 2) == openvino_genai.StreamingStatus.CANCEL:
                    self.cancelled += 1
                    reason = openvino_genai.GenerationFinishReason.NONE
                    break
            streamer.end()
            self.written.append(written)
            return SimpleNamespace(finish_reasons=[reason], tokens=[[1] * written], scores=[0.0])
        finally:
            with self._lock:
                self.inside -= 1


async def start_stateful(
    nursery: trio.Nursery, limits: AdmissionLimits = AdmissionLimits(max_running_sequences=1), **options: Any
) -> SimpleNamespace:
    """A StatefulScheduler over a FakeLLMPipeline, running in `nursery`: `pipeline`,
    `scheduler`, `observed` (fake_engine.Observed) and `stop()`, which cancels its loop."""
    pipeline = FakeLLMPipeline(options.pop("seconds_per_token", 0.002))
    observed = Observed()
    scheduler = StatefulScheduler(pipeline, None, VOCABULARY, limits=limits, observer=observed, **options)
    scope = trio.CancelScope()

    async def run(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            await scheduler.run(task_status=task_status)

    await nursery.start(run)
    return SimpleNamespace(pipeline=pipeline, scheduler=scheduler, stop=scope.cancel, observed=observed)
