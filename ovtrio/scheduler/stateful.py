"""The one-at-a-time scheduler over OpenVINO GenAI's stateful LLMPipeline (the NPU's).

Same interface as the continuous-batching Scheduler (check_capacity, submit, drain,
idle, in_flight, fail_all, stats, run), so the API layer serves either; both keep their
requests the same way (intake.py: submission, draining, the slow-reader timeout). The
pipeline runs one sequence: requests wait in arrival order (at most
`max_queued_requests`, beyond that Overloaded) and the loop task runs them one after
the other.

For each request the loop starts `pipeline.generate(ids, config, streamer)` in a worker
thread (it releases the GIL while it computes) and, while it runs, delivers what the
streamer wrote (streamer.py) through the same Delivery as the other backend:
detokenizing, stop strings (matched here, then the generation is cancelled), deltas,
observer timings. Leaving the submit block, a stop string, the slow-reader timeout and
fail_all() all cancel the generation, which stops at its next token; the loop starts the
next request only once generate() has returned, so the pipeline is never entered twice.

Engine calls: `generate()` in the worker thread; nothing else touches the pipeline while
it runs (the tokenizer is used by the loop's detokenizer, which is thread-safe, see
scheduler.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from functools import partial
from typing import Any

import trio

from ovtrio.constraints.cache import EngineGrammars
from ovtrio.engine.tensors import prompt_tensor
from ovtrio.scheduler.admission import AdmissionLimits
from ovtrio.scheduler.intake import SHUTTING_DOWN, RequestIntake
from ovtrio.scheduler.interface import SchedulerStats
from ovtrio.scheduler.observer import RequestObserver
from ovtrio.scheduler.outputs import Failed
from ovtrio.scheduler.params import (
    GenerationRequest,
    UnsupportedParams,
    engine_prompt,
    to_generation_config,
)
from ovtrio.scheduler.requests import ActiveRequest, Admission, EngineRequest, RequestStream
from ovtrio.scheduler.streamer import DEFAULT_LIMIT, GeneratedTokens, make_streamer

log = logging.getLogger("ovtrio.scheduler")


class StatefulScheduler:
    """The one-at-a-time scheduler: its loop (run) serves one request at a time; the
    requests it takes on are kept by a RequestIntake, to which it is the EngineSide."""

    def __init__(
        self,
        pipeline: Any,
        tokenizer: Any,
        vocabulary: Any = None,
        stream_interval: int = 0,
        limits: AdmissionLimits = AdmissionLimits(max_running_sequences=1),
        observer: RequestObserver | None = None,
        buffered_tokens: int = DEFAULT_LIMIT,
        vocabulary_size: int | None = None,
    ) -> None:
        """`pipeline` is an openvino_genai.LLMPipeline; `limits.max_running_sequences` is
        ignored (one request runs). `buffered_tokens`: ids the streamer keeps for a
        consumer that does not read before the generation waits (streamer.py). The
        rest as for Scheduler."""
        # The streamer passes token ids only: no log-probabilities to send on.
        self._intake = RequestIntake(
            self,
            tokenizer,
            vocabulary,
            stream_interval,
            limits,
            observer,
            scores_tokens=False,
            vocabulary_size=vocabulary_size,
        )
        self._pipeline = pipeline
        # The grammar compilers generate() builds: forgotten once the loop ends, before
        # the pipeline (which frees them) can go.
        self._grammars = EngineGrammars()
        self._model_stop_token_ids = frozenset(pipeline.get_generation_config().stop_token_ids)
        self._buffered_tokens = buffered_tokens
        self._generating = False
        self._generations = 0
        self._reads = 0
        self._generate_seconds = 0.0

    # ---- what the API layer and the service use (interface.py) ---------------------------

    def check_capacity(self) -> None:
        self._intake.check_capacity()

    async def checked(self, request: GenerationRequest) -> GenerationRequest:
        return await self._intake.checked(request)

    def submit(self, request: GenerationRequest) -> AbstractAsyncContextManager[RequestStream]:
        return self._intake.submit(request)

    def drain(self) -> None:
        self._intake.drain()

    @property
    def in_flight(self) -> int:
        return self._intake.in_flight

    async def idle(self) -> None:
        await self._intake.idle()

    def fail_all(self, message: str, code: str = SHUTTING_DOWN, *, waiting: bool = True) -> int:
        return self._intake.fail_all(message, code, waiting=waiting)

    # ---- what the intake asks of the pipeline (EngineSide) -------------------------------

    def room(self) -> int:
        return 0 if self._intake.active or self._generating else 1

    def load(self) -> str:
        return f"a request is running and {self._intake.waiting} are waiting"

    def refuse_unsupported(self, request: GenerationRequest) -> None:
        if len(request.prompts) != 1 or request.params.n != 1 or request.params.beam_search:
            raise UnsupportedParams("the stateful backend makes one choice of one prompt per request")

    async def prepared(self, request: GenerationRequest) -> GenerationRequest:
        return request

    def left(self, active: ActiveRequest, outcome: str | None) -> None:
        self._intake.wake()  # the loop may be waiting for this request's tokens

    def wanted(self) -> None:
        """The loop wakes for new work by itself: the pipeline has no run to hand back."""

    # ---- the loop -----------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the queued requests one at a time, oldest first; sleep while there are none."""
        self._intake.running = True
        task_status.started()
        try:
            while True:
                if not self._intake.queued:
                    await self._intake.wait_for_work()
                    continue
                request_id, admission = next(iter(self._intake.queued.items()))
                del self._intake.queued[request_id]
                await self._serve(admission)
        finally:
            self._intake.running = False
            self._grammars.forget()
            self._intake.fail_all("server is shutting down", SHUTTING_DOWN)

    def _generate(self, run: Callable[[], Any]) -> Any:
        """Run a generation, in a worker thread."""
        with self._grammars.building():
            return run()

    async def _serve(self, admission: Admission) -> None:
        """Run one request: generate in a worker thread, deliver as tokens arrive."""
        active, request = admission.active, admission.request
        assert request is not None, "the stateful backend takes no reservations (it does not score)"
        params = request.params
        prompt_ids = request.prompts[0]
        try:
            config = to_generation_config(params, model_stop_token_ids=self._model_stop_token_ids)
        except Exception as exc:  # noqa: BLE001 - settings the engine cannot take
            admission.error = UnsupportedParams(str(exc).splitlines()[0])
            active.close()
            admission.added.set()
            return
        tokens = GeneratedTokens(partial(self._wake_soon, trio.lowlevel.current_trio_token()), self._buffered_tokens)
        sequence = self._intake.delivery.new_sequence(0, prompt_ids, params)
        active.sequences.append(sequence)
        active.parts.append(EngineRequest(tokens, [sequence]))
        self._intake.active[active.request_id] = active
        active.added_at = time.monotonic()
        waited = active.added_at - active.submitted_at
        self._intake.retry_hint.observe(waited)
        self._intake.observer.queued(waited)
        self._intake.prompt_tokens += active.prompt_tokens
        admission.added.set()

        if request.texts is not None:  # a VLMPipeline: text and images
            text, images = engine_prompt(request.texts[0])
            run = partial(self._pipeline.generate, text, images=images, generation_config=config)
        else:
            run = partial(self._pipeline.generate, prompt_tensor(prompt_ids), config)
        streamer = make_streamer(tokens)
        outcome: list[Any] = []  # the generate() result, or the exception it raised
        done = trio.Event()

        async def generate() -> None:
            started = time.perf_counter()
            self._generating = True
            self._generations += 1
            try:
                outcome.append(await trio.to_thread.run_sync(self._generate, partial(run, streamer=streamer)))
            except Exception as exc:  # noqa: BLE001 - an engine fault: fail this request, keep serving
                outcome.append(exc)
            finally:
                self._generating = False
                self._generate_seconds += time.perf_counter() - started
                done.set()
                self._intake.wake()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(generate)
            try:
                while not done.is_set():
                    await self._intake.wait_for_work(self._intake.pause_deadline(active))
                    self._deliver(active)
            finally:
                tokens.cancel()  # no-op once generate() has returned
        result = outcome[0] if outcome else None
        if active.request_id not in self._intake.active:
            return  # ended meanwhile: consumer left, stop string, timeout or fail_all
        if isinstance(result, Exception):
            log.error("generation failed: %s", str(result).splitlines()[0] if str(result) else type(result).__name__)
            active.send(Failed(f"engine error: {result}".splitlines()[0], "engine_error"))
            self._intake.abort(active.request_id, "error")
            return
        tokens.finish(_finish_reason(result, tokens.written, params.max_new_tokens))
        # The last tokens and the finish reason; a paused consumer gets them once it
        # catches up, or its request ends at the slow-reader timeout.
        self._deliver(active)
        while active.request_id in self._intake.active and active.paused_at is not None:
            await self._intake.wait_for_work(self._intake.pause_deadline(active))
            self._deliver(active)
        if active.request_id in self._intake.active:  # not expected: the finish reason ends it
            active.send(Failed("the generation ended without a finish reason", "engine_error"))
            self._intake.abort(active.request_id, "error")

    def _wake_soon(self, token: trio.lowlevel.TrioToken) -> None:
        """From the generating thread: wake the loop (never waits)."""
        try:
            token.run_sync_soon(self._intake.wake)
        except trio.RunFinishedError:
            pass

    def _deliver(self, active: ActiveRequest) -> None:
        if active.request_id not in self._intake.active:
            return
        self._intake.resume_or_expire(active, trio.current_time())
        outputs, decisions = self._intake.delivery.read_outputs()
        self._intake.apply(decisions)
        if outputs:
            self._reads += 1
            self._intake.apply(self._intake.delivery.deliver(outputs, self._reads))

    # ---- observation --------------------------------------------------------------------

    def stats(self) -> SchedulerStats:
        """Counters. An engine "step" here is one generated token (one inference each);
        step_seconds is the time spent inside generate(). No paged KV cache: usage 0."""
        running = len(self._intake.active)
        return SchedulerStats(
            running=running,
            queued=len(self._intake.queued),
            running_sequences=running,
            paused=self._intake.paused(),
            rejected=self._intake.rejected,
            slow_readers_cancelled=self._intake.slow_readers_cancelled,
            engine_requests=int(self._generating),
            engine_scheduled=int(self._generating),
            waiting=len(self._intake.queued),
            kv_cache_usage=0.0,
            steps=self._intake.delivery.generated_tokens,
            step_seconds=self._generate_seconds,
            prompt_tokens=self._intake.prompt_tokens,
            generated_tokens=self._intake.delivery.generated_tokens,
            steps_started=self._generations,
            step_in_flight=self._generating,
            step_releases_gil=True,
        )


def _finish_reason(result: Any, generated: int, max_new_tokens: int) -> str:
    import openvino_genai

    reasons = getattr(result, "finish_reasons", None) or []
    if reasons and reasons[0] == openvino_genai.GenerationFinishReason.LENGTH:
        return "length"
    if reasons and reasons[0] == openvino_genai.GenerationFinishReason.STOP:
        return "stop"
    return "length" if generated >= max_new_tokens else "stop"
