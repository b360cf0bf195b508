"""The continuous-batching loop: one trio task owns the engine and steps it.

Why the engine is stepped on the trio thread itself: `ContinuousBatchingPipeline.step()`
holds the GIL for the whole step, so running it in a worker thread would freeze the
event loop just the same, and add a thread hand-off per step plus GIL convoys (the
worker keeps the GIL for up to the switch interval after each step). Stepping inline
makes the order explicit instead: step, hand every request its delta, then let every
consumer task run until all are blocked again (they format and write their chunks),
then step again. The Python work between steps is the server's whole overhead; bench/
measures it against the raw engine.

The scheduler knows nothing of HTTP: requests come in as token ids plus
SamplingParams, and go out as typed messages (messages.py) on a per-request channel.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import trio
import trio.testing

from ovtrio.scheduler.echo import EchoedPrompt, PromptNotScored
from ovtrio.scheduler.messages import Completed, Delta, Failed, Message
from ovtrio.scheduler.params import GenerationRequest, SamplingParams, UnsupportedParams, to_generation_config
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
    echo: EchoedPrompt | None = None  # the prompt still to split off the output's front


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


@dataclass(frozen=True)
class SchedulerStats:
    running: int
    engine_requests: int
    engine_scheduled: int
    kv_cache_usage: float
    steps: int
    step_seconds: float
    generated_tokens: int


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
    def __init__(self, pipeline: Any, tokenizer: Any, vocabulary: Any = None, stream_interval: int = 0) -> None:
        """`vocabulary` (ovtrio.vocabulary.Vocabulary), when given, detokenizes in Python
        instead of calling the engine's detokenizer every step. `stream_interval` is the
        number of steps between deltas (0: chosen by load, see _stream_interval)."""
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
        self._ids = itertools.count(1)
        self._work = trio.Event()
        self._steps = 0
        self._step_seconds = 0.0
        self._generated_tokens = 0
        self._running = False

    # ---- submission side (called from request handlers) --------------------------------

    @contextmanager
    def submit(self, request: GenerationRequest) -> Iterator[RequestStream]:
        """Queue `request`; the stream is valid inside the with-block.

        Leaving the block (normally, by an error, or by cancellation when the client
        goes away) cancels the engine request if it is still running, so no request
        outlives its handler.
        """
        if not self._running:
            raise RuntimeError("scheduler is not running")
        request_id = next(self._ids)
        send, receive = trio.open_memory_channel[Message](math.inf)
        params = request.params
        active = _ActiveRequest(
            request_id=request_id,
            send=send,
            prompt_tokens=sum(len(p) for p in request.prompts),
            logprobs=params.logprobs or params.prompt_logprobs,
        )
        # Register the output state before the engine can produce anything for it.
        self._active[request_id] = active
        try:
            for prompt_ids in request.prompts:
                self._add_engine_requests(active, prompt_ids, params)
        except BaseException:
            self._abort(request_id)
            raise
        self._work.set()
        try:
            with receive:
                yield RequestStream(request_id, receive)
        finally:
            self._abort(request_id)

    def _add_engine_requests(self, active: _ActiveRequest, prompt_ids: list[int], params: SamplingParams) -> None:
        import openvino as ov

        prompt = ov.Tensor(np.asarray([prompt_ids], dtype=np.int64))

        def new_sequences(count: int) -> list[_Sequence]:
            made = [
                _Sequence(
                    len(active.sequences) + i,
                    self._detokenizer(prompt_ids, params),
                    StopMatcher(params.stop, params.include_stop_str_in_output),
                    echo=EchoedPrompt(len(active.sequences) + i, prompt_ids) if params.prompt_logprobs else None,
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
        self._running = True
        task_status.started()
        # True so the first idle pass runs one empty step: the engine may hold requests
        # that finished before the loop started (the service's warm-up generation), which
        # it releases, and stops counting in its metrics, only inside a step.
        stepped_since_idle = True
        try:
            while True:
                if not self._active and not self._pipeline.has_non_finished_requests():
                    if stepped_since_idle:
                        # The engine releases finished and cancelled requests (and their
                        # KV blocks) only inside a step; one empty step costs ~0.1 ms.
                        stepped_since_idle = False
                        self._pipeline.step()
                        continue
                    await self._work.wait()
                    self._work = trio.Event()
                    continue
                stepped_since_idle = True
                started = time.perf_counter()
                try:
                    self._pipeline.step()
                except Exception as exc:  # an engine fault: fail this batch, keep serving
                    log.exception("engine step failed")
                    self._fail_all(f"engine error: {exc}".splitlines()[0])
                    continue
                self._steps += 1
                self._step_seconds += time.perf_counter() - started
                self._collect_outputs()
                # Let every consumer write what it was just handed before the next step
                # freezes the event loop again.
                await trio.testing.wait_all_tasks_blocked()
        finally:
            self._running = False
            self._fail_all("server is shutting down")

    def _fail_all(self, message: str) -> None:
        for request_id in list(self._active):
            active = self._active[request_id]
            self._send(active, Failed(message, "engine_error"))
            self._abort(request_id)

    def _send(self, active: _ActiveRequest, message: Message) -> bool:
        try:
            active.send.send_nowait(message)
            return True
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False

    def _collect_outputs(self) -> None:
        """Read every handle once, detokenize all new ids in one batch, send deltas."""
        fresh: list[tuple[_ActiveRequest, _EngineRequest, _Sequence, list[int], list[float], str | None]] = []
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
                        if sequence.echo is not None:
                            try:
                                ids, logprobs = self._split_prompt(active, sequence, ids, logprobs)
                            except PromptNotScored as exc:
                                failed = Failed(str(exc), "prompt_logprobs_unavailable")
                                break
                        fresh.append((active, part, sequence, ids, logprobs, reason))
                        read_any = True
                if failed is not None:
                    break
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

    def _split_prompt(
        self, active: _ActiveRequest, sequence: _Sequence, ids: list[int], logprobs: list[float]
    ) -> tuple[list[int], list[float]]:
        """Send the scored prompt once it has arrived; what follows it is generated."""
        assert sequence.echo is not None
        ids, logprobs, prompt = sequence.echo.take(ids, logprobs)
        if prompt is not None:
            sequence.echo = None
            self._send(active, prompt)
        return ids, logprobs

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
        Hypercorn and h11), paid between steps while the engine waits. With many
        streams that adds up to over 10% of the engine's time, so by default deltas
        are merged over two steps from 12 streams on and three from 24 on: tokens then
        reach a reader every 40-90 ms instead of every 20-30 ms, and the engine keeps
        its throughput. A configured interval overrides this.
        """
        if self._configured_interval:
            return self._configured_interval
        return min(3, 1 + len(self._active) // 12)

    # ---- observation --------------------------------------------------------------------

    def stats(self) -> SchedulerStats:
        metrics = self._pipeline.get_metrics()
        return SchedulerStats(
            running=len(self._active),
            engine_requests=int(metrics.requests),
            engine_scheduled=int(metrics.scheduled_requests),
            kv_cache_usage=float(metrics.cache_usage),
            steps=self._steps,
            step_seconds=self._step_seconds,
            generated_tokens=self._generated_tokens,
        )

