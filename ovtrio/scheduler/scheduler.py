"""The continuous-batching loop: one trio task owns the engine; steps run in a thread.

Why a worker thread: an engine step takes 10-150 ms on the embedded 135M model and
seconds for a prefill chunk of a 1B-class model on a small CPU. Stepped on the trio
thread, it stops the event loop for that long: /health, new connections and every
stream's writes wait for the step. So the loop task hands each step to a worker thread
(step_thread.py) and awaits it, and the step releases the GIL (engine_step.py), so the
event loop keeps serving while the engine computes. With a step that holds the GIL (the
binding's, when the GIL-free route is off or fails its checks), the thread changes
nothing: the loop pauses during each step, as it did when it stepped inline.

The order, with a GIL-free step: the loop adds the requests submitted meanwhile and
starts a run of steps (step_thread.py). After each step the worker thread itself reads
every handle and the engine's state and, while the loop has nothing to do between steps,
starts the next step at once; the loop gets step N's outputs while step N+1 runs,
detokenizes them and sends each request its delta, and the handlers format and write
their chunks. A request that arrives, a consumer that catches up, a request that ends
(room for queued ones) or a slice of a long prompt ends the run after the step in
flight, and the loop does its work between steps as before. Why runs: handing every step
back to the loop costs two thread wake-ups between steps (0.3-0.6 ms on a 2-core
virtual machine, 5% of a decode step of the embedded model for one stream), time in
which the engine sits idle. With a step that holds the GIL, each run is one step: the
deltas go out first, and the step starts when the event loop has nothing left to run
(every consumer has written its chunk, every request that arrived meanwhile has been
read; step_thread.py), since it pauses the loop until it ends. Either way the hand-off
is explicit: the loop task starts the run and awaits each step.

Engine calls and threads. Each call is made between steps, by the loop task or by the
worker thread of a run between two of its steps, except where this list says otherwise:

- `step()`: in the worker thread, one at a time.
- `add_request()`: between steps, by the loop (`submit()` queues the request and waits
  until it is added, which is when the running sequences leave room for it, see
  admission.py, and for a long prompt once its slices are prefilled, see prefill.py).
  Not safe during a step: with prefix caching on, it restores the prompt's cached KV
  blocks into the scheduler's block tables outside any lock the step takes (the
  engine's mutex there only orders concurrent add_request calls), racing the step's own
  block allocation.
- `has_non_finished_requests()`, `get_metrics()`: between steps, by the worker after
  each step of a run (Scheduler._after_step) or by the loop when no run is in flight;
  both read state the step writes without a lock. `stats()` returns the values read
  after the last step, so a /metrics scrape never touches the engine.
- a handle's `can_read()`, `read()`, `get_status()`: between steps, by the worker after
  each step of a run (delivery.read_engine, on the handles planned when the run began)
  or by the loop when no run is in flight (Delivery.read_outputs), for every request but
  the paused ones (a slow reader's tokens wait in its handle; what a run read for a
  request that paused during it waits in its EngineRequest). They are thread-safe (a
  mutex per request), but read together with a step in flight, a request could be seen
  FINISHED before its last tokens were read. The loop processes what the worker read
  (Delivery.outputs_from), so the worker touches no state of the loop's.
- a handle's `cancel()`, and dropping a handle (which stops its request): at any time,
  from any task (a client leaving: ActiveRequest.close, requests.py; a stop string:
  Delivery.deliver, delivery.py; a slow reader's timeout: the loop, between steps). They set the request's status under its mutex; the
  step acts on it at its end and frees the KV blocks (the loop runs one more, empty,
  step when nothing else is left).
- the tokenizer (`encode`, `decode`, `apply_chat_template`): at any time, from handlers
  and from the loop's detokenizer (Delivery.deliver). The tokenizer takes a separate
  inference request from its own pool for each call, and the engine's use of it (stop
  strings) does the same; the chat template is rendered from a string set once at load.

The scheduler knows nothing of HTTP: requests come in as token ids plus
SamplingParams, and go out as typed messages (messages.py) on a per-request channel.
This module has admission to the engine, the loop and its stats; submission, draining
and the slow-reader timeout, which the stateful backend shares, are in intake.py, the
limits it admits by and what it tells observers in admission.py, what is kept for each
request in requests.py, long prompts prefilled in slices in prefill.py, and the output
side (reading handles after a step, text, stop strings, deltas) in delivery.py.

Shutdown comes in two moves, so that the server can let running requests finish: `drain()`
stops admission (submit raises NotAccepting) while the loop keeps stepping what it has,
and `idle()` returns once nothing is in flight; `fail_all()` ends whatever is left (each
request gets a Failed, its engine request is cancelled). Cancelling `run()` does the
latter by itself.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import trio

from ovtrio.scheduler.admission import AdmissionLimits
from ovtrio.scheduler.delivery import EngineReads, PlannedRead, StepOutput, read_engine
from ovtrio.scheduler.engine_step import EngineStep
from ovtrio.scheduler.intake import SHUTTING_DOWN, NotAccepting, RequestIntake  # noqa: F401 (NotAccepting: still importable here)
from ovtrio.scheduler.observer import RequestObserver
from ovtrio.scheduler.params import SamplingParams, TextPrompt, UnsupportedParams, to_generation_config
from ovtrio.scheduler.prefill import SlicedPrefill, slice_params, slice_size
from ovtrio.scheduler.requests import ActiveRequest, Admission, EngineRequest, Sequence
from ovtrio.scheduler.step_thread import StepThread

log = logging.getLogger("ovtrio.scheduler")

# What a run's worker read after a step (Scheduler._after_step): the handles' outputs,
# has_non_finished_requests() and get_metrics().
StepState = tuple[EngineReads, bool, Any]


def _first_line(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    # Engine messages start with a "[time] /build/path/file.cc:line:" prefix.
    text = lines[0] if lines else type(exc).__name__
    return text.split(": ", 1)[-1] if text.startswith("[") else text


def waiting_requests(queued: int, engine_requests: int, engine_scheduled: int) -> int:
    """Engine requests that wait for the engine: those of requests queued for room in it
    (`queued`, added between two steps), and those it holds but did not schedule in its
    last step (its metrics' requests - scheduled_requests)."""
    return queued + max(0, engine_requests - engine_scheduled)


def ov_tensor(prompt_ids: list[int]) -> Any:
    """A prompt as the engine takes it: a [1, n] tensor of int64 token ids."""
    import openvino as ov

    return ov.Tensor(np.asarray([prompt_ids], dtype=np.int64))


def engine_prompt(text: TextPrompt) -> tuple[str, list[Any]]:
    """A text prompt as a vision-language model's engine takes it: the text, and each
    image as a uint8 HWC tensor."""
    import openvino as ov

    return text.text, [ov.Tensor(np.ascontiguousarray(image, dtype=np.uint8)) for image in text.images]


@dataclass(frozen=True)
class SchedulerStats:
    running: int  # requests in the engine
    queued: int  # requests queued for room in the engine
    running_sequences: int  # engine sequences of the running requests
    paused: int  # running requests whose consumer lags (see admission.py)
    rejected: int  # requests refused with Overloaded, ever
    slow_readers_cancelled: int  # requests cancelled because their consumer stopped reading, ever
    engine_requests: int
    engine_scheduled: int
    waiting: int  # engine requests not in the last step (waiting_requests)
    kv_cache_usage: float  # percent
    steps: int
    step_seconds: float
    prompt_tokens: int  # of the requests added to the engine
    generated_tokens: int
    steps_started: int  # engine steps entered, empty ones included
    step_in_flight: bool  # the engine is inside a step right now
    step_releases_gil: bool


class Scheduler(RequestIntake):
    def __init__(
        self,
        pipeline: Any,
        tokenizer: Any,
        vocabulary: Any = None,
        stream_interval: int = 0,
        step: EngineStep | None = None,
        limits: AdmissionLimits = AdmissionLimits(),
        observer: RequestObserver | None = None,
        prefill_slice_tokens: int = 0,
        step_tokens: int = 256,
        kv_block_tokens: int = 32,
        step_runs: bool = True,
    ) -> None:
        """`vocabulary` (ovtrio.model.vocabulary.Vocabulary), when given, detokenizes in
        Python instead of calling the engine's detokenizer every step. `stream_interval`
        is the number of steps between deltas (0: chosen by load, see
        Delivery._stream_interval). `step` is how to step the engine (engine_step.choose_step); by default the
        binding's `pipeline.step()`. `limits`: how much work it takes on (admission.py).
        `observer` hears each request's timings and end (observer.py).
        `prefill_slice_tokens`: prompts longer than this are prefilled in slices of at
        most this many tokens first, each fitting in one step of the engine's
        `step_tokens` budget (max_num_batched_tokens), in whole blocks of
        `kv_block_tokens` (prefill.py; 0: never; it needs the engine's prefix cache).
        `step_runs`: with a GIL-free step, the worker steps on by itself while the loop
        has nothing to do between steps (see above); False hands every step back to the
        loop (bench/scheduler_overhead.py compares the two)."""
        super().__init__(tokenizer, vocabulary, stream_interval, limits, observer)
        self._pipeline = pipeline
        self._prefill_slice_tokens = prefill_slice_tokens
        self._step_runs = step_runs
        self._step_tokens = step_tokens
        self._kv_block_tokens = kv_block_tokens
        import openvino_genai

        self._finished_status = openvino_genai.GenerationStatus.FINISHED
        self._running_status = openvino_genai.GenerationStatus.RUNNING
        # Requests in the engine whose long prompts are still being prefilled in slices.
        self._prefilling: dict[int, SlicedPrefill] = {}
        self._model_stop_token_ids = frozenset(pipeline.get_config().stop_token_ids)
        # Engine sequences of the requests in the engine (ActiveRequest.weight).
        self._running_sequences = 0
        self._stepper = StepThread(
            step or EngineStep(pipeline.step, releases_gil=False, description="the binding's step()")
        )
        self._steps = 0
        self._step_seconds = 0.0
        # Engine state read by the loop between steps (see the module docstring).
        self._engine_unfinished = False
        self._engine_metrics: Any = None

    # ---- admission: queued requests into the engine ------------------------------------

    def _room_in_engine(self) -> int:
        return max(0, self._limits.max_running_sequences - self._running_sequences)

    def _describe_load(self) -> str:
        return f"{self._running_sequences} sequences are running and {len(self._queued)} requests are waiting"

    def _left_engine(self, active: ActiveRequest, outcome: str | None) -> None:
        # Its sequences make room for the queued requests at the next admission.
        self._running_sequences -= active.weight
        prefill = self._prefilling.pop(active.request_id, None)
        if prefill is not None:
            # Ended while its prompt was prefilled (failed, or its consumer left), before
            # its choices existed: the observer hears of each, and its submitter stops
            # waiting and finds the reason in its channel (or in admission.error).
            if outcome is not None:
                for _ in range(prefill.choices):
                    self._observer.ended(outcome)
            prefill.admission.added.set()

    def _admit(self) -> bool:
        """Add waiting requests, oldest first, while the running sequences leave room
        (between steps only); True if the engine got any. A request larger than the
        whole limit runs when nothing else does. A request with a long prompt is only
        registered here: `_advance_prefills` adds its first slice, after the requests
        admitted with it (prefill.py)."""
        added = False
        now = time.monotonic()
        while self._queued:
            request_id, admission = next(iter(self._queued.items()))
            active = admission.active
            limit = self._limits.max_running_sequences
            if self._running_sequences and self._running_sequences + active.weight > limit:
                break
            # Register the output state before the engine can produce anything for it.
            del self._queued[request_id]
            self._active[request_id] = active
            self._running_sequences += active.weight
            waited = now - active.submitted_at
            self._retry_hint.observe(waited)
            if admission.request is None:  # a reservation: its holder does the work
                admission.added.set()
                continue
            if not self._register_sliced_prefill(admission, waited):
                self._add_admitted(admission, waited)
                added = True
        return added

    def _register_sliced_prefill(self, admission: Admission, waited: float) -> bool:
        """Register an admitted request with long prompts to be prefilled in slices
        (prefill.py); False if it has none."""
        request = admission.request
        threshold = self._prefill_slice_tokens
        # A text prompt (a vision-language model's) goes to the engine whole.
        if not threshold or request.texts is not None:
            return False
        long_prompts = [prompt for prompt in request.prompts if len(prompt) > threshold]
        if not long_prompts:
            return False
        config = self._config(slice_params(request.params), 0)
        prefill = SlicedPrefill(admission, long_prompts, config)
        self._prefilling[admission.active.request_id] = prefill
        # It is in the engine from its first slice on: its wait for room ends here.
        for _ in range(prefill.choices):
            self._observer.queued(waited)
        return True

    def _add_admitted(self, admission: Admission, waited: float | None) -> None:
        """Add the engine requests of an admitted request, and let its submitter go on;
        `waited`, its time in the queue, unless already reported (a sliced prefill)."""
        active = admission.active
        try:
            request = admission.request
            for i, prompt_ids in enumerate(request.prompts):
                text = request.texts[i] if request.texts is not None else None
                self._add_engine_requests(active, prompt_ids, request.params, text)
        except UnsupportedParams as exc:
            admission.error = exc
            self._abort(active.request_id, None)
        else:
            self._prompt_tokens += active.prompt_tokens
            if waited is not None:
                for _ in active.sequences:
                    self._observer.queued(waited)
        admission.added.set()

    def _add_prefix(self, active: ActiveRequest, prefill: SlicedPrefill) -> bool:
        """Add the engine request for the next prefix of a prompt prefilled in slices,
        sized to fit in one step beside the sequences decoding; False if none is left. It
        is one of the request's parts with no choices of its own (delivery.py reads
        nothing from it, and fails the request if the engine drops it)."""
        decoding = self._running_sequences - active.weight
        size = slice_size(self._prefill_slice_tokens, self._step_tokens, self._kv_block_tokens, decoding)
        prefix = prefill.next_prefix(size)
        if prefix is None:
            return False
        handle = self._add_request(ov_tensor(prefix), prefill.config)
        prefill.running = EngineRequest(handle, [])
        active.parts.append(prefill.running)
        return True

    def _advance_prefills(self, arrivals: bool) -> bool:
        """For each request prefilled in slices that has no prefix running (just
        admitted, or the engine finished its last one; between steps): add the next
        prefix, or the request itself once none is left. With `arrivals` (requests were
        just added whole), the next slice waits one step, once in a row: the new
        requests' first step is then a light one, so a short request gets its first
        token within one decode step of the slice that was running when it came. True
        if the engine got anything."""
        advanced = False
        for request_id, prefill in list(self._prefilling.items()):
            active = self._active[request_id]
            running = prefill.running
            if running is not None:
                if running.handle.get_status() != self._finished_status:
                    continue
                active.parts.remove(running)
                running.handle = None
                prefill.running = None
            if arrivals and not prefill.gave_way:
                prefill.gave_way = True
                continue
            prefill.gave_way = False
            advanced = True
            try:
                sliced = self._add_prefix(active, prefill)
            except UnsupportedParams as exc:  # the engine refused the slice's request
                prefill.admission.error = exc
                self._abort(request_id, None)
                continue
            if not sliced:
                del self._prefilling[request_id]
                self._add_admitted(prefill.admission, None)
        return advanced

    def _add_engine_requests(
        self, active: ActiveRequest, prompt_ids: list[int], params: SamplingParams, text: TextPrompt | None = None
    ) -> None:
        prompt = engine_prompt(text) if text is not None else ov_tensor(prompt_ids)

        def new_sequences(count: int) -> list[Sequence]:
            made = [
                self._delivery.new_sequence(len(active.sequences) + i, prompt_ids, params) for i in range(count)
            ]
            active.sequences.extend(made)
            return made

        if params.beam_search:
            sequences = new_sequences(params.n)
            handle = self._add_request(prompt, self._config(params, 0))
            active.parts.append(EngineRequest(handle, sequences, beam_search=True))
            return
        for sibling in range(params.n):
            sequences = new_sequences(1)
            handle = self._add_request(prompt, self._config(params, sibling))
            active.parts.append(EngineRequest(handle, sequences))

    def _add_request(self, prompt: Any, config: Any) -> Any:
        try:
            if isinstance(prompt, tuple):  # text and images (engine_prompt)
                return self._pipeline.add_request(next(self._ids), prompt[0], prompt[1], config)
            return self._pipeline.add_request(next(self._ids), prompt, config)
        except RuntimeError as exc:  # e.g. a grammar XGrammar cannot compile
            raise UnsupportedParams(_first_line(exc)) from None

    def _config(self, params: SamplingParams, seed_offset: int) -> Any:
        return to_generation_config(
            params, seed_offset=seed_offset, model_stop_token_ids=self._model_stop_token_ids
        )

    # ---- slow readers -------------------------------------------------------------------

    def _resume_or_expire_paused(self) -> bool:
        """Resume the paused requests whose consumers have caught up, and cancel those
        paused for longer than the timeout (between steps); True if any resumed."""
        resumed = False
        now = trio.current_time()
        for active in list(self._active.values()):
            if self._resume_or_expire(active, now):
                resumed = True
        return resumed

    def _next_pause_deadline(self) -> float:
        return min((self._pause_deadline(a) for a in self._active.values()), default=math.inf)

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
        outputs: list[StepOutput] = []
        try:
            while True:
                if self._resume_or_expire_paused():
                    # What a resumed request's handles hold (no step is in flight here).
                    outputs += self._delivery.read_outputs()
                # New requests go to the engine before the next slice of a long prompt:
                # the engine gives each step's budget to prompts in the order added.
                admitted = self._admit()
                advanced = self._advance_prefills(arrivals=admitted)
                working = admitted or advanced or self._engine_unfinished
                if not working:
                    # Nothing for the engine to do: the last tokens go out now.
                    self._delivery.deliver(outputs, self._steps)
                    outputs = []
                    if not release_due:
                        with trio.move_on_at(self._next_pause_deadline()):
                            await self._work.wait()
                        self._work = trio.Event()
                        continue
                # The engine releases finished and cancelled requests (and stops counting
                # them in its metrics) only inside a step: after work, one more, empty one.
                release_due = working
                if self._stepper.releases_gil:
                    plan = self._delivery.read_plan()
                    # A run goes on by itself only while the loop has nothing to do
                    # between its steps: no slices to add, no paused request to watch.
                    steps_on = self._step_runs and not self._prefilling and not self._paused()
                    self._stepper.start(after_step=partial(self._after_step, plan, steps_on))
                    self._delivery.deliver(outputs, self._steps)
                else:
                    self._delivery.deliver(outputs, self._steps)
                    self._stepper.start(when_idle=True)
                outputs = []
                try:
                    outputs = await self._collect_run(working)
                except Exception as exc:  # an engine fault: fail this batch, keep serving
                    log.exception("engine step failed")
                    self.fail_all(f"engine error: {exc}".splitlines()[0], "engine_error", waiting=False)
                    self._read_engine_state()
                    continue
        finally:
            self._running = False
            self._stepper.close()
            self.fail_all("server is shutting down", SHUTTING_DOWN)

    def _after_step(self, plan: list[PlannedRead], steps_on: bool) -> tuple[StepState, bool]:
        """In the worker thread, between two steps of a run: read the handles of `plan`
        and the engine's state, and say whether to step again at once. The run goes on
        while `steps_on`, the engine has unfinished requests and every planned request
        still runs: one that finished, failed or was cancelled may make room for queued
        requests or end a slice of a long prompt, which the loop handles between steps."""
        reads = read_engine(plan)
        unfinished, metrics = self._engine_state()
        more = steps_on and unfinished and all(status == self._running_status for *_, status in reads[1])
        return (reads, unfinished, metrics), more

    async def _collect_run(self, working: bool) -> list[StepOutput]:
        """Await each step of the run in flight; deliver the outputs of every step but the
        last while the next one runs, and return the last one's (the loop delivers them
        while its next run runs). `working`: the run's first step had work (it counts)."""
        while True:
            result = await self._stepper.wait()
            if working:
                self._steps += 1
                self._step_seconds += result.seconds
            if result.value is None:  # a one-step run without reads: the loop reads
                fresh = self._delivery.read_outputs()
                self._read_engine_state()
            else:
                reads, self._engine_unfinished, self._engine_metrics = result.value
                fresh = self._delivery.outputs_from(reads)
            if result.last:
                return fresh
            self._delivery.deliver(fresh, self._steps)
            if self._paused():
                self._stepper.hand_back()  # a consumer lags: stop reading its request

    def _engine_wanted(self) -> None:
        # A request arrived or a consumer caught up: the run in flight ends after its
        # step, so the loop admits or resumes it between steps.
        self._stepper.hand_back()

    def _engine_state(self) -> tuple[bool, Any]:
        """Whether the engine has unfinished requests, and its metrics (between steps)."""
        return bool(self._pipeline.has_non_finished_requests()), self._pipeline.get_metrics()

    def _read_engine_state(self) -> None:
        """What the loop and stats() need from the engine, read while no step runs."""
        self._engine_unfinished, self._engine_metrics = self._engine_state()

    # ---- observation --------------------------------------------------------------------

    def stats(self) -> SchedulerStats:
        """Counters, and the engine's metrics as read after the last step (no engine call)."""
        metrics = self._engine_metrics
        if metrics is None:
            metrics = self._pipeline.get_metrics()  # before run() started: no step can run
        engine_requests = int(metrics.requests)
        engine_scheduled = int(metrics.scheduled_requests)
        queued_engine_requests = sum(admission.engine_requests for admission in self._queued.values())
        return SchedulerStats(
            running=len(self._active),
            queued=len(self._queued),
            running_sequences=self._running_sequences,
            paused=self._paused(),
            rejected=self._rejected,
            slow_readers_cancelled=self._slow_readers_cancelled,
            engine_requests=engine_requests,
            engine_scheduled=engine_scheduled,
            waiting=waiting_requests(queued_engine_requests, engine_requests, engine_scheduled),
            kv_cache_usage=float(metrics.cache_usage),
            steps=self._steps,
            step_seconds=self._step_seconds,
            prompt_tokens=self._prompt_tokens,
            generated_tokens=self._delivery.generated_tokens,
            steps_started=self._stepper.entered,
            step_in_flight=self._stepper.inside_step,
            step_releases_gil=self._stepper.releases_gil,
        )

