"""The continuous-batching loop: one trio task owns the engine; steps run in a thread.

Why a worker thread: an engine step takes 10-150 ms on the embedded 135M model and
seconds for a prefill chunk of a 1B-class model on a small CPU. Stepped on the trio
thread, it stops the event loop for that long: /health, new connections and every
stream's writes wait for the step. So the loop task hands each step to a worker thread
(step_thread.py) and awaits it, and the step releases the GIL (engine_step.py), so the
event loop keeps serving while the engine computes. With a step that holds the GIL (the
binding's, when the GIL-free route is off or fails its checks), the thread changes
nothing: the loop pauses during each step, as it did when it stepped inline.

The order, with a GIL-free step: step N ends; the loop reads every handle, adds the
requests submitted meanwhile and starts step N+1; while N+1 runs it detokenizes step N's
tokens and sends each request its delta, and the handlers format and write their chunks.
With a step that holds the GIL, the deltas go out first, and step N+1 starts when the
event loop has nothing left to run (every consumer has written its chunk, every request
that arrived meanwhile has been read; step_thread.py), since it pauses the loop until it
ends. Either way the hand-off is explicit: the loop task starts the step and awaits it.

Engine calls and threads. The loop task calls the engine only between steps, except
where this list says otherwise:

- `step()`: in the worker thread, one at a time.
- `add_request()`: between steps, by the loop (`submit()` queues the request and waits
  until it is added). Not safe during a step: with prefix caching on, it restores the
  prompt's cached KV blocks into the scheduler's block tables outside any lock the step
  takes (the engine's mutex there only orders concurrent add_request calls), racing the
  step's own block allocation.
- `has_non_finished_requests()`, `get_metrics()`: between steps, by the loop; both read
  state the step writes without a lock. `stats()` returns the values read after the last
  step, so a /metrics scrape never touches the engine.
- a handle's `can_read()`, `read()`, `get_status()`: between steps, by the loop. They are
  thread-safe (a mutex per request), but read together with a step in flight, a request
  could be seen FINISHED before its last tokens were read.
- a handle's `cancel()`, and dropping a handle (which stops its request): at any time,
  from any task (a client leaving, a stop string). They set the request's status under
  its mutex; the step acts on it at its end and frees the KV blocks (the loop runs one
  more, empty, step when nothing else is left).
- the tokenizer (`encode`, `decode`, `apply_chat_template`): at any time, from handlers
  and from the loop's detokenizer. The tokenizer takes a separate inference request from
  its own pool for each call, and the engine's use of it (stop strings) does the same;
  the chat template is rendered from a string set once at load.

The scheduler knows nothing of HTTP: requests come in as token ids plus
SamplingParams, and go out as typed messages (messages.py) on a per-request channel.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import trio

from ovtrio.scheduler.engine_step import EngineStep
from ovtrio.scheduler.messages import Completed, Delta, Failed, Message
from ovtrio.scheduler.params import GenerationRequest, SamplingParams, UnsupportedParams, to_generation_config
from ovtrio.scheduler.step_thread import StepThread
from ovtrio.scheduler.text_output import (
    Detokenizer,
    IncrementalDetokenizer,
    StopMatcher,
    VocabularyDetokenizer,
    decode_batch,
)

log = logging.getLogger("ovtrio.scheduler")


def _finish_reason_names() -> dict[Any, str]:
    import openvino_genai

    reasons = openvino_genai.GenerationFinishReason
    return {reasons.STOP: "stop", reasons.LENGTH: "length"}


def _first_line(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    # Engine messages start with a "[time] /build/path/file.cc:line:" prefix.
    text = lines[0] if lines else type(exc).__name__
    return text.split(": ", 1)[-1] if text.startswith("[") else text


def _generation_status() -> Any:
    import openvino_genai

    return openvino_genai.GenerationStatus


@dataclass(eq=False)
class _Sequence:
    index: int
    detokenizer: Detokenizer
    stops: StopMatcher
    finish_reason: str | None = None
    generated: int = 0
    held_text: str = ""
    held_ids: list[int] = field(default_factory=list)
    held_logprobs: list[float] | None = None


@dataclass(eq=False)
class _EngineRequest:
    """One engine request of an ovtrio request, and the choices it produces: one, or
    the n best beams of a beam search (which the engine reports only at the end)."""

    handle: Any  # openvino_genai.GenerationHandle; dropping it cancels the engine request
    sequences: list[_Sequence]
    beam_search: bool = False
    done: bool = False


@dataclass(eq=False)
class _ActiveRequest:
    request_id: int
    send: trio.MemorySendChannel[Message]
    prompt_tokens: int
    logprobs: bool
    parts: list[_EngineRequest] = field(default_factory=list)
    sequences: list[_Sequence] = field(default_factory=list)
    sent_first_token: bool = False


@dataclass(eq=False)
class _Admission:
    """A submitted request waiting for the loop to add it to the engine between steps."""

    active: _ActiveRequest
    request: GenerationRequest
    added: trio.Event = field(default_factory=trio.Event)
    error: UnsupportedParams | None = None


# What one step produced for one sequence: its request, engine request, new ids, their
# log-probabilities, and the finish reason if it ended.
_Output = tuple[_ActiveRequest, _EngineRequest, _Sequence, list[int], list[float], "str | None"]


@dataclass(frozen=True)
class SchedulerStats:
    running: int
    engine_requests: int
    engine_scheduled: int
    kv_cache_usage: float
    steps: int
    step_seconds: float
    generated_tokens: int
    steps_started: int  # engine steps entered, empty ones included
    step_in_flight: bool  # the engine is inside a step right now
    step_releases_gil: bool


class RequestStream:
    """The consumer's end of one request: messages in arrival order.

    `receive_available()` waits for at least one message and returns all that are
    queued, so a consumer that fell behind catches up in one go instead of writing one
    chunk per engine step.
    """

    def __init__(self, request_id: int, receive: trio.MemoryReceiveChannel[Message]) -> None:
        self.request_id = request_id
        self._receive = receive

    async def receive_available(self) -> list[Message]:
        """Wait for the next messages; [] once the request is over (channel closed)."""
        try:
            messages = [await self._receive.receive()]
        except trio.EndOfChannel:
            return []
        while True:
            try:
                messages.append(self._receive.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                return messages


class Scheduler:
    def __init__(
        self,
        pipeline: Any,
        tokenizer: Any,
        vocabulary: Any = None,
        stream_interval: int = 0,
        step: EngineStep | None = None,
    ) -> None:
        """`vocabulary` (ovtrio.vocabulary.Vocabulary), when given, detokenizes in Python
        instead of calling the engine's detokenizer every step. `stream_interval` is the
        number of steps between deltas (0: chosen by load, see _stream_interval).
        `step` is how to step the engine (engine_step.choose_step); by default the
        binding's `pipeline.step()`."""
        self._configured_interval = stream_interval
        self._holding: set[_Sequence] = set()
        self._pipeline = pipeline
        self._tokenizer = tokenizer
        self._vocabulary = vocabulary
        self._reasons = _finish_reason_names()
        self._model_stop_token_ids = frozenset(pipeline.get_config().stop_token_ids)
        status = _generation_status()
        self._finished_status = status.FINISHED
        self._failed_statuses = {
            status.IGNORED: (
                "the request does not fit in the KV cache; retry later or send a shorter one",
                "out_of_memory",
            ),
        }
        self._active: dict[int, _ActiveRequest] = {}
        self._admissions: list[_Admission] = []
        self._ids = itertools.count(1)
        self._work = trio.Event()
        self._stepper = StepThread(
            step or EngineStep(pipeline.step, releases_gil=False, description="the binding's step()")
        )
        self._steps = 0
        self._step_seconds = 0.0
        self._generated_tokens = 0
        self._running = False
        # Engine state read by the loop between steps (see the module docstring).
        self._engine_unfinished = False
        self._engine_metrics: Any = None

    # ---- submission side (called from request handlers) --------------------------------

    @asynccontextmanager
    async def submit(self, request: GenerationRequest) -> AsyncIterator[RequestStream]:
        """Queue `request`; the stream is valid inside the async with-block.

        Entering waits until the loop has added the request to the engine, between two
        steps, so that anything the engine refuses (UnsupportedParams) is raised here,
        before a handler answers 200. Leaving the block (normally, by an error, or by
        cancellation when the client goes away) cancels the engine request if it is
        still running, so no request outlives its handler.
        """
        if not self._running:
            raise RuntimeError("scheduler is not running")
        request_id = next(self._ids)
        send, receive = trio.open_memory_channel[Message](math.inf)
        active = _ActiveRequest(
            request_id=request_id,
            send=send,
            prompt_tokens=sum(len(p) for p in request.prompts),
            logprobs=request.params.logprobs,
        )
        # Register the output state before the engine can produce anything for it.
        self._active[request_id] = active
        admission = _Admission(active, request)
        self._admissions.append(admission)
        self._work.set()
        try:
            await admission.added.wait()
            if admission.error is not None:
                raise admission.error
            with receive:
                yield RequestStream(request_id, receive)
        finally:
            self._abort(request_id)

    def _admit(self) -> bool:
        """Add the requests submitted since the last step (between steps only); True if
        the engine got any."""
        admissions, self._admissions = self._admissions, []
        added = False
        for admission in admissions:
            active = admission.active
            if active.request_id in self._active:  # else its handler left while it waited
                try:
                    for prompt_ids in admission.request.prompts:
                        self._add_engine_requests(active, prompt_ids, admission.request.params)
                        added = True
                except UnsupportedParams as exc:
                    admission.error = exc
                    self._abort(active.request_id)
            admission.added.set()
        return added

    def _add_engine_requests(self, active: _ActiveRequest, prompt_ids: list[int], params: SamplingParams) -> None:
        import openvino as ov

        prompt = ov.Tensor(np.asarray([prompt_ids], dtype=np.int64))

        def new_sequences(count: int) -> list[_Sequence]:
            made = [
                _Sequence(
                    len(active.sequences) + i,
                    self._detokenizer(prompt_ids, params),
                    StopMatcher(params.stop, params.include_stop_str_in_output),
                )
                for i in range(count)
            ]
            active.sequences.extend(made)
            return made

        if params.beam_search:
            sequences = new_sequences(params.n)
            handle = self._add_request(prompt, self._config(params, 0))
            active.parts.append(_EngineRequest(handle, sequences, beam_search=True))
            return
        for sibling in range(params.n):
            sequences = new_sequences(1)
            handle = self._add_request(prompt, self._config(params, sibling))
            active.parts.append(_EngineRequest(handle, sequences))

    def _add_request(self, prompt: Any, config: Any) -> Any:
        try:
            return self._pipeline.add_request(next(self._ids), prompt, config)
        except RuntimeError as exc:  # e.g. a grammar XGrammar cannot compile
            raise UnsupportedParams(_first_line(exc)) from None

    def _config(self, params: SamplingParams, seed_offset: int) -> Any:
        return to_generation_config(
            params, seed_offset=seed_offset, model_stop_token_ids=self._model_stop_token_ids
        )

    def _detokenizer(self, prompt_ids: list[int], params: SamplingParams) -> Detokenizer:
        if self._vocabulary is not None:
            return VocabularyDetokenizer(
                self._vocabulary.token_bytes,
                self._vocabulary.special_ids,
                params.skip_special_tokens,
                params.keep_special_token_ids,
            )
        # The engine's detokenizer skips all special tokens or none.
        return IncrementalDetokenizer(prompt_ids, params.skip_special_tokens)

    def _abort(self, request_id: int) -> None:
        active = self._active.pop(request_id, None)
        if active is None:
            return
        self._holding.difference_update(active.sequences)
        # Frees the KV cache at the next step; the handle's destructor would too, but
        # saying so is clearer than relying on reference counting.
        for part in active.parts:
            if not part.done:
                part.handle.cancel()
            part.handle = None
        active.send.close()

    # ---- the loop -----------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Step the engine while there is work; sleep (no CPU) while there is none."""
        self._read_engine_state()
        self._running = True
        task_status.started()
        # True so the first idle pass runs one empty step: the engine may hold requests
        # that finished before the loop started (the service's warm-up generation), which
        # it releases, and stops counting in its metrics, only inside a step.
        release_due = True
        outputs: list[_Output] = []
        try:
            while True:
                working = self._admit() or self._engine_unfinished
                if not working:
                    # Nothing for the engine to do: the last tokens go out now.
                    self._deliver(outputs)
                    outputs = []
                    if not release_due:
                        await self._work.wait()
                        self._work = trio.Event()
                        continue
                # The engine releases finished and cancelled requests (and stops counting
                # them in its metrics) only inside a step: after work, one more, empty one.
                release_due = working
                if self._stepper.releases_gil:
                    self._stepper.start()
                    self._deliver(outputs)
                else:
                    self._deliver(outputs)
                    self._stepper.start(when_idle=True)
                outputs = []
                try:
                    await self._stepper.wait()
                except Exception as exc:  # an engine fault: fail this batch, keep serving
                    log.exception("engine step failed")
                    self._fail_all(f"engine error: {exc}".splitlines()[0], waiting=False)
                    self._read_engine_state()
                    continue
                if working:
                    self._steps += 1
                    self._step_seconds += self._stepper.last_seconds
                outputs = self._read_outputs()
                self._read_engine_state()
        finally:
            self._running = False
            self._stepper.close()
            self._fail_all("server is shutting down")

    def _read_engine_state(self) -> None:
        """What the loop and stats() need from the engine, read while no step runs."""
        self._engine_unfinished = bool(self._pipeline.has_non_finished_requests())
        self._engine_metrics = self._pipeline.get_metrics()

    def _fail_all(self, message: str, *, waiting: bool = True) -> None:
        """Fail every request in the engine, and with `waiting` those not yet added."""
        for request_id in list(self._active):
            active = self._active[request_id]
            if not active.parts and not waiting:
                continue  # submitted during the failed step: it runs in the next one
            self._send(active, Failed(message, "engine_error"))
            self._abort(request_id)
        if waiting:
            # Waiting submitters find their request failed (its channel holds the reason).
            admissions, self._admissions = self._admissions, []
            for admission in admissions:
                admission.added.set()

    def _send(self, active: _ActiveRequest, message: Message) -> bool:
        try:
            active.send.send_nowait(message)
            return True
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False

    def _read_outputs(self) -> list[_Output]:
        """Read every handle once (between steps); requests the engine failed get Failed."""
        fresh: list[_Output] = []
        for active in list(self._active.values()):
            failed = None
            for part in active.parts:
                if part.done:
                    continue
                handle = part.handle
                read_any = False
                if handle.can_read():
                    outputs = handle.read().values()
                    if part.beam_search:
                        # Beam ids are arbitrary; choices are numbered best first.
                        outputs = sorted(outputs, key=lambda output: output.score, reverse=True)
                    for sequence, output in zip(part.sequences, outputs):
                        reason = self._reasons.get(output.finish_reason)
                        ids = list(output.generated_ids)
                        logprobs = list(output.generated_log_probs) if active.logprobs else []
                        fresh.append((active, part, sequence, ids, logprobs, reason))
                        read_any = True
                status = handle.get_status()
                if status in self._failed_statuses:
                    failed = Failed(*self._failed_statuses[status])
                    break
                if status == self._finished_status and not read_any:
                    # Finished with nothing left to read: close what never saw a reason.
                    fresh.extend((active, part, s, [], [], "stop") for s in part.sequences if s.finish_reason is None)
            if failed is not None:
                self._send(active, failed)
                self._abort(active.request_id)
        return fresh

    def _deliver(self, fresh: list[_Output]) -> None:
        """Detokenize all new ids in one batch and send each request its delta.

        With a GIL-free step this runs while the next step is in flight: the handle
        calls it makes (`cancel()` when a stop string ends a request) are safe then.
        """
        if not fresh:
            return
        detokenizers = []
        for _, _, sequence, ids, _, _ in fresh:
            sequence.detokenizer.append(ids)
            detokenizers.append(sequence.detokenizer)
        texts = decode_batch(self._tokenizer, detokenizers)

        flush = self._steps % self._stream_interval() == 0
        for (active, part, sequence, ids, logprobs, reason), text in zip(fresh, texts):
            if active.request_id not in self._active or sequence.finish_reason is not None:
                continue
            first = not active.sent_first_token
            active.sent_first_token = True
            sequence.generated += len(ids)
            self._generated_tokens += len(ids)
            text, matched = sequence.stops.feed(text)
            if matched:
                reason = "stop"
                if len(part.sequences) == 1:
                    part.handle.cancel()  # a stop string ended it: free the engine's work
                    part.done = True
            elif reason is not None:
                text += sequence.stops.flush()
            sequence.finish_reason = reason
            if all(s.finish_reason is not None for s in part.sequences):
                part.done = True
            sequence.held_text += text
            sequence.held_ids.extend(ids)
            if active.logprobs:
                sequence.held_logprobs = (sequence.held_logprobs or []) + logprobs
            # The first token and the last always go out at once (time to first token,
            # completion); the ones between may wait for the next flush step.
            if first or reason is not None or flush:
                if not self._release(active, sequence):
                    continue
            else:
                self._holding.add(sequence)
            if all(s.finish_reason is not None for s in active.sequences):
                self._send(active, Completed(active.prompt_tokens, sum(s.generated for s in active.sequences)))
                self._abort(active.request_id)
        if flush and self._holding:
            for active in list(self._active.values()):
                for sequence in active.sequences:
                    if sequence in self._holding:
                        self._release(active, sequence)

    def _release(self, active: _ActiveRequest, sequence: _Sequence) -> bool:
        """Send what `sequence` holds; False (and the request aborted) if its consumer left."""
        self._holding.discard(sequence)
        delta = Delta(
            sequence.index, sequence.held_text, sequence.held_ids, sequence.finish_reason, sequence.held_logprobs
        )
        sequence.held_text, sequence.held_ids, sequence.held_logprobs = "", [], None
        if self._send(active, delta):
            return True
        self._abort(active.request_id)
        return False

    def _stream_interval(self) -> int:
        """Engine steps between deltas to consumers.

        Each delta costs its consumer an HTTP write (about 0.1 ms through Quart,
        Hypercorn and h11). With a step that holds the GIL that is paid between steps
        while the engine waits; with a GIL-free step it runs beside the engine but takes
        CPU from the engine's own threads on a small machine. With many streams that
        adds up to over 10% of the engine's time, so by default deltas are merged over
        two steps from 12 streams on and three from 24 on: tokens then reach a reader
        every 40-90 ms instead of every 20-30 ms, and the engine keeps its throughput.
        A configured interval overrides this.
        """
        if self._configured_interval:
            return self._configured_interval
        return min(3, 1 + len(self._active) // 12)

    # ---- observation --------------------------------------------------------------------

    def stats(self) -> SchedulerStats:
        """Counters, and the engine's metrics as read after the last step (no engine call)."""
        metrics = self._engine_metrics
        if metrics is None:
            metrics = self._pipeline.get_metrics()  # before run() started: no step can run
        return SchedulerStats(
            running=len(self._active),
            engine_requests=int(metrics.requests),
            engine_scheduled=int(metrics.scheduled_requests),
            kv_cache_usage=float(metrics.cache_usage),
            steps=self._steps,
            step_seconds=self._step_seconds,
            generated_tokens=self._generated_tokens,
            steps_started=self._stepper.entered,
            step_in_flight=self._stepper.inside_step,
            step_releases_gil=self._stepper.releases_gil,
        )

