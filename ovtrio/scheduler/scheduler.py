"""The continuous-batching loop: one trio task owns the engine; steps run in a thread.

The loop task hands each step to a worker thread and awaits it (step_thread.py says
why a thread, and why runs of steps), and the step releases the GIL (engine_step.py),
so the event loop keeps serving while the engine computes. With a step that holds the
GIL (the binding's, when the GIL-free route is off or fails its checks), the thread
changes nothing: the loop pauses during each step, as it did when it stepped inline.

The order, with a GIL-free step: the loop adds the requests submitted meanwhile and
starts a run of steps (step_thread.py). After each step the worker thread itself reads
every handle and the engine's state and, while the loop has nothing to do between steps,
starts the next step at once; the loop gets step N's outputs while step N+1 runs,
detokenizes them and sends each request its delta, and the handlers format and write
their chunks. A request that arrives, a consumer that catches up, a request that ends
(room for queued ones) or a slice of a long prompt ends the run after the step in
flight, and the loop does its work between steps as before. With a step that holds the
GIL, each run is one step: the deltas go out first, and the step starts when the event
loop has nothing left to run
(every consumer has written its chunk, every request that arrived meanwhile has been
read; step_thread.py), since it pauses the loop until it ends. Either way the hand-off
is explicit: the loop task starts the run and awaits each step.

Engine calls and threads. Each call is made between steps, by the loop task or by the
worker thread of a run between two of its steps, except where this list says otherwise:

- `step()`: in the worker thread, one at a time; the GIL-free step (engine_step.py) or
  the binding's, chosen before each run (stepping.py).
- `add_request()`: between steps, by the loop (engine_admission.py) (`submit()` queues the
  request and waits until it is added, which is when the running sequences leave room
  for it, see admission.py, and for a long prompt once its slices are prefilled, see
  prefill.py).
  Not safe during a step: with prefix caching on, it restores the prompt's cached KV
  blocks into the scheduler's block tables outside any lock the step takes (the
  engine's mutex there only orders concurrent add_request calls), racing the step's own
  block allocation.
- `has_non_finished_requests()`, `get_metrics()`: between steps, by the worker after
  each step of a run (`_after_step`) or by the loop when no run is in flight;
  both read state the step writes without a lock. `stats()` returns the values read
  after the last step, so a /metrics scrape never touches the engine.
- a handle's `can_read()`, `read()`, `get_status()`: between steps, by the worker after
  each step of a run (reads.read_engine, on the handles planned when the run began)
  or by the loop when no run is in flight (Delivery.read_outputs), for every request but
  the paused ones (a slow reader's tokens wait in its handle; what a run read for a
  request that paused during it waits in its EngineRequest). They are thread-safe (a
  mutex per request), but read together with a step in flight, a request could be seen
  FINISHED before its last tokens were read. The loop processes what the worker read
  (Delivery.outputs_from), so the worker touches no state of the loop's.
- a handle's `cancel()`, and dropping a handle (which stops its request): at any time,
  from any task (a client leaving: ActiveRequest.close, requests.py), and by the loop
  (RequestIntake.apply: the stop strings and ends Delivery decided, while the next step of
  a run may be in flight; a slow reader's timeout, between steps). They set the
  request's status under its mutex; the step acts on it at its end and frees the KV
  blocks (the loop runs one more, empty, step when nothing else is left).
- the tokenizer (`encode`, `decode`, `apply_chat_template`): at any time, from handlers
  and from the loop's detokenizer (Delivery.deliver). The tokenizer takes a separate
  inference request from its own pool for each call, and the engine's use of it (stop
  strings) does the same; the chat template is rendered from a string set once at load.

The loop checks the rule where it makes the calls that need it: `add_request()`, its own
handle reads and engine-state reads, and the slow-reader cancels assert that no step is
in flight (StepThread.assert_between_steps, which the EngineAdmission is given); the worker's reads
happen, by construction, between the steps of its own run.

The scheduler knows nothing of HTTP: requests come in as token ids plus
SamplingParams, and go out as typed outputs (outputs.py) on a per-request channel.
This module has the loop and its stats. Its collaborators: the RequestIntake
(intake.py: submission, draining and the slow-reader timeout, which the stateful
backend shares; the scheduler answers its questions as its EngineSide), and the
EngineAdmission (engine_admission.py: adding queued requests to the engine, long
prompts in slices, prefill.py). The ways of stepping are in stepping.py, the limits
requests are admitted by and what observers are told in admission.py, what is kept for
each request in requests.py, what a step's reads hold in reads.py, and the output side
(text, stop strings, deltas) in delivery.py.

Shutdown comes in two moves, so that the server can let running requests finish: `drain()`
stops admission (submit raises NotAccepting) while the loop keeps stepping what it has,
and `idle()` returns once nothing is in flight; `fail_all()` ends whatever is left (each
request gets a Failed, its engine request is cancelled). Cancelling `run()` does the
latter by itself.
"""

from __future__ import annotations

import logging
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio

from ovtrio.constraints.cache import EngineGrammars
from ovtrio.constraints.check import GrammarLimits
from ovtrio.engine.errors import client_reason
from ovtrio.scheduler.admission import AdmissionLimits
from ovtrio.scheduler.engine_admission import EngineAdmission
from ovtrio.scheduler.engine_step import EngineStep
from ovtrio.scheduler.intake import SHUTTING_DOWN, NotAccepting, RequestIntake  # noqa: F401 (NotAccepting: still importable here)
from ovtrio.scheduler.interface import SchedulerStats, waiting_requests
from ovtrio.scheduler.observer import RequestObserver
from ovtrio.scheduler.params import GenerationRequest
from ovtrio.scheduler.prefill_policy import PrefillPolicy
from ovtrio.scheduler.reads import EngineReads, PlannedRead, StepOutput, read_engine
from ovtrio.scheduler.requests import ActiveRequest, RequestStream
from ovtrio.scheduler.step_thread import AfterStep, StepThread
from ovtrio.scheduler.stepping import Stepping, choose_stepping

log = logging.getLogger("ovtrio.scheduler")


@dataclass(frozen=True, slots=True)
class StepState:
    """What a run's worker read after a step (`_after_step` below): the handles'
    outputs, has_non_finished_requests() and get_metrics()."""

    reads: EngineReads
    unfinished: bool
    metrics: Any


class Scheduler:
    """The continuous-batching scheduler: its loop (run) steps the engine; the requests
    it takes on are kept by a RequestIntake, to which it is the EngineSide, and taken
    into the engine by an EngineAdmission."""

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
        grammar_limits: GrammarLimits = GrammarLimits(),
        vocabulary_size: int | None = None,
        prefill_whole_above: int = 0,
        max_itl_seconds: float | None = None,
    ) -> None:
        """`vocabulary` (ovtrio.text.vocabulary.Vocabulary), when given, detokenizes in
        Python instead of calling the engine's detokenizer every step.
        `vocabulary_size`: how many ids the engine's detokenizer has text for (None: not
        known); a reply that holds an id past it, or past `vocabulary`'s table, fails
        alone (Failed "token_outside_vocabulary"). `stream_interval`
        is the number of steps between deltas (0: chosen by load, see delivery.py).
        `step` is how to step the engine (engine_step.choose_step); by default the
        binding's `pipeline.step()`. `limits`: how much work it takes on (admission.py).
        `observer` hears each request's timings and end (observer.py).
        `prefill_slice_tokens`: prompts longer than this are prefilled in slices of at
        most this many tokens first, each fitting in one step of the engine's
        `step_tokens` budget (max_num_batched_tokens), in whole blocks of
        `kv_block_tokens` (prefill.py; 0: never; it needs the engine's prefix cache).
        `max_itl_seconds`: the slices adapt (prefill_policy.py): alone, a step's whole
        budget; beside decoding sequences, what keeps a step within this bound (None:
        fixed slices of `prefill_slice_tokens`).
        `prefill_whole_above`: prompts longer than this are prefilled in one step, never
        in slices, and added once no other prompt is being prefilled (prefill.py; 0:
        none must be).
        `step_runs`: with a GIL-free step, the worker steps on by itself while the loop
        has nothing to do between steps (see above); False hands every step back to the
        loop (`python -m bench scheduler_overhead` compares the two)."""
        self._pipeline = pipeline
        self._step_runs = step_runs
        import openvino_genai

        self._running_status = openvino_genai.GenerationStatus.RUNNING
        binding = EngineStep(pipeline.step, releases_gil=False, description="the binding's step()")
        # The grammar compilers the engine builds in its steps: forgotten once the loop
        # ends, before the pipeline (which frees them) can go.
        self._grammars = EngineGrammars()
        self._stepper: StepThread[StepState] = StepThread(step or binding, self._grammars)
        self._intake = RequestIntake(
            self, tokenizer, vocabulary, stream_interval, limits, observer, vocabulary_size=vocabulary_size
        )
        self._admission = EngineAdmission(
            pipeline,
            self._intake,
            self._stepper.assert_between_steps,
            tokenizer,
            vocabulary,
            PrefillPolicy(step_tokens, kv_block_tokens, prefill_slice_tokens, max_itl_seconds),
            grammar_limits,
            prefill_whole_above,
        )
        self._steps = 0
        self._step_seconds = 0.0
        # Engine state read by the loop between steps (see the module docstring).
        self._engine_unfinished = False
        self._engine_metrics: Any = None

    # ---- what the API layer and the service use (interface.py) ---------------------------

    def check_capacity(self) -> None:
        self._intake.check_capacity()

    async def checked(self, request: GenerationRequest) -> GenerationRequest:
        return await self._intake.checked(request)

    def submit(self, request: GenerationRequest) -> AbstractAsyncContextManager[RequestStream]:
        return self._intake.submit(request)

    def reserve(self, places: int) -> AbstractAsyncContextManager[None]:
        return self._intake.reserve(places)

    def drain(self) -> None:
        self._intake.drain()

    @property
    def in_flight(self) -> int:
        return self._intake.in_flight

    async def idle(self) -> None:
        await self._intake.idle()

    def fail_all(self, message: str, code: str = SHUTTING_DOWN, *, waiting: bool = True) -> int:
        return self._intake.fail_all(message, code, waiting=waiting)

    @property
    def prefill_policy(self) -> PrefillPolicy:
        """What sizes the slices of long prompts (prefill_policy.py)."""
        return self._admission.policy

    # ---- what the intake asks of its engine (EngineSide) ----------------------------------

    def room(self) -> int:
        return self._admission.room()

    def load(self) -> str:
        return self._admission.load()

    def refuse_unsupported(self, request: GenerationRequest) -> None:
        """Every request goes on: the engine refuses what it cannot run as it is added."""

    async def prepared(self, request: GenerationRequest) -> GenerationRequest:
        return await self._admission.prepared(request)

    def left(self, active: ActiveRequest, outcome: str | None) -> None:
        self._admission.left(active, outcome)

    def wanted(self) -> None:
        # A request arrived or a consumer caught up: the run in flight ends after its
        # step, so the loop admits or resumes it between steps.
        self._stepper.hand_back()

    # ---- the loop -----------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Step the engine while there is work; sleep (no CPU) while there is none.

        Each pass begins with no step in flight:

        1. resume the paused requests whose consumers have caught up (what their handles
           hold is read now), and cancel those paused for too long;
        2. add the queued requests to the engine (those with images from a worker
           thread: engine_admission.py), then the next slices of long prompts (new
           requests first: the engine gives each step's budget to prompts in the order
           added);
        3. with nothing for the engine to do, deliver the last tokens and sleep until
           work comes (after one more, empty, step: the engine releases finished and
           cancelled requests, and stops counting them in its metrics, only inside a
           step);
        4. start a run of steps, one of the ways of stepping.py, and deliver what the
           last run produced beside it (_start_run);
        5. await the run's steps, delivering each one's outputs while the next one runs;
           the last one's are delivered at the next pass's step 4. An engine fault fails
           the batch and the loop goes on.
        """
        self._read_engine_state()
        self._intake.running = True
        task_status.started()
        # True so the first idle pass runs one empty step: the engine may hold requests
        # that finished before the loop started (the service's warm-up generation).
        release_due = True
        pending: list[StepOutput] = []
        try:
            while True:
                pending += self._resume_or_expire_paused()  # 1
                admitted = self._admission.admit()  # 2
                if self._admission.has_image_requests:
                    await self._admission.add_image_requests()
                advanced = self._admission.advance_prefills(arrivals=admitted)
                working = admitted or advanced or self._engine_unfinished
                if not working:  # 3
                    self._deliver(pending)
                    pending = []
                    if not release_due:
                        await self._wait_for_work()
                        continue
                release_due = working
                self._start_run(pending)  # 4
                pending = []
                try:
                    pending = await self._collect_run(working)  # 5
                except Exception as exc:  # an engine fault: fail this batch, keep serving
                    log.exception("engine step failed")
                    self._intake.fail_all(f"engine error: {client_reason(exc)}", "engine_error", waiting=False)
                    self._read_engine_state()
        except Exception:
            # The loop itself failed: the model's service marks the model failed
            # (serving/service.py); what was in flight learns why, not of a shutdown.
            self._intake.fail_all("the model stopped serving after an internal error", "engine_error")
            raise
        finally:
            self._intake.running = False
            self._stepper.close()
            self._grammars.forget()
            self._admission.close()
            self._intake.fail_all("server is shutting down", SHUTTING_DOWN)

    async def _wait_for_work(self) -> None:
        """Sleep until a request arrives or a consumer catches up, or until the next
        paused request's slow-reader timeout."""
        await self._intake.wait_for_work(self._intake.next_pause_deadline())

    def _start_run(self, pending: list[StepOutput]) -> None:
        """Start the next run of steps, the way stepping.py chooses, and deliver
        `pending` (the last run's outputs) beside it."""
        stepping = choose_stepping(
            gil_free=self._stepper.releases_gil,
            # Runs go on by themselves only while the loop has nothing to do between
            # steps: no slices to add, no paused request to watch.
            runs=self._step_runs and not self._admission.prefilling and not self._intake.paused(),
        )
        if stepping is Stepping.WHEN_IDLE:
            # It holds the GIL until it ends: the deltas go out first, and the step starts
            # once the event loop has nothing left to run. The loop reads after it.
            self._deliver(pending)
            self._stepper.start(when_idle=True)
            return
        # GIL-free: the step starts at once, its worker reads the handles planned now,
        # and the last run's outputs are delivered while it runs.
        plan = self._intake.delivery.read_plan()
        self._stepper.start(after_step=partial(self._after_step, plan, stepping is Stepping.RUNS))
        self._deliver(pending)

    def _after_step(self, plan: list[PlannedRead], runs: bool) -> AfterStep[StepState]:
        """In the worker thread, between two steps of a run: read the handles of `plan`
        and the engine's state, and say whether to step again at once. The run goes on
        while `runs`, the engine has unfinished requests and every planned request
        still runs: one that finished, failed or was cancelled may make room for queued
        requests or end a slice of a long prompt, which the loop handles between steps."""
        reads = read_engine(plan)
        unfinished, metrics = self._engine_state()
        running = self._running_status
        step_again = runs and unfinished and all(entry.status == running for entry in reads.entries)
        return AfterStep(StepState(reads, unfinished, metrics), step_again)

    async def _collect_run(self, working: bool) -> list[StepOutput]:
        """Await each step of the run in flight; deliver the outputs of every step but the
        last while the next one runs, and return the last one's (the loop delivers them
        while its next run runs). `working`: the run's first step had work (it counts)."""
        while True:
            result = await self._stepper.wait()
            if working:
                self._steps += 1
                self._step_seconds += result.seconds
                admission = self._admission
                # What the loop added went into the run's first step; the rest decode.
                admission.policy.observe(result.seconds, admission.take_prompt_tokens(), admission.decoding())
            state = result.value
            if state is None:  # a step through the binding: the loop reads
                fresh = self._read_between_steps()
                self._read_engine_state()
            else:
                self._engine_unfinished, self._engine_metrics = state.unfinished, state.metrics
                fresh, decisions = self._intake.delivery.outputs_from(state.reads)
                self._intake.apply(decisions)
            if result.last:
                return fresh
            self._deliver(fresh)
            if self._intake.paused():
                self._stepper.hand_back()  # a consumer lags: stop reading its request

    # ---- what the loop does between and beside steps ---------------------------------------

    def _read_between_steps(self) -> list[StepOutput]:
        """Read every handle but the paused requests' (no step in flight)."""
        self._stepper.assert_between_steps("reading the handles")
        fresh, decisions = self._intake.delivery.read_outputs()
        self._intake.apply(decisions)
        return fresh

    def _deliver(self, outputs: list[StepOutput]) -> None:
        """Deliver `outputs`; what delivery raises fails the requests they belong to and
        not the loop (it may run beside a step in flight, which must be awaited)."""
        delivery = self._intake.delivery
        try:
            decisions = delivery.deliver(outputs, self._steps)
        except Exception as exc:
            log.exception("delivering a step's outputs failed")
            decisions = delivery.failed(outputs, f"engine error: {client_reason(exc)}")
        self._intake.apply(decisions)

    def _resume_or_expire_paused(self) -> list[StepOutput]:
        """Resume the paused requests whose consumers have caught up, and cancel those
        paused for longer than the timeout (between steps); what the resumed ones'
        handles hold."""
        self._stepper.assert_between_steps("resuming or cancelling slow readers")
        resumed = False
        now = trio.current_time()
        for active in list(self._intake.active.values()):
            if self._intake.resume_or_expire(active, now):
                resumed = True
        return self._read_between_steps() if resumed else []

    def _engine_state(self) -> tuple[bool, Any]:
        """Whether the engine has unfinished requests, and its metrics (between steps)."""
        return bool(self._pipeline.has_non_finished_requests()), self._pipeline.get_metrics()

    def _read_engine_state(self) -> None:
        """What the loop and stats() need from the engine, read while no step runs."""
        self._stepper.assert_between_steps("reading the engine's state")
        self._engine_unfinished, self._engine_metrics = self._engine_state()

    # ---- observation --------------------------------------------------------------------

    def stats(self) -> SchedulerStats:
        """Counters, and the engine's metrics as read after the last step (no engine call)."""
        metrics = self._engine_metrics
        if metrics is None:
            metrics = self._pipeline.get_metrics()  # before run() started: no step can run
        engine_requests = int(metrics.requests)
        engine_scheduled = int(metrics.scheduled_requests)
        queued_engine_requests = sum(admission.engine_requests for admission in self._intake.queued.values())
        return SchedulerStats(
            running=len(self._intake.active),
            queued=len(self._intake.queued),
            running_sequences=self._admission.running_sequences,
            paused=self._intake.paused(),
            rejected=self._intake.rejected,
            slow_readers_cancelled=self._intake.slow_readers_cancelled,
            engine_requests=engine_requests,
            engine_scheduled=engine_scheduled,
            waiting=waiting_requests(queued_engine_requests, engine_requests, engine_scheduled),
            kv_cache_usage=float(metrics.cache_usage),
            steps=self._steps,
            step_seconds=self._step_seconds,
            prompt_tokens=self._intake.prompt_tokens,
            generated_tokens=self._intake.delivery.generated_tokens,
            steps_started=self._stepper.entered,
            step_in_flight=self._stepper.inside_step,
            step_releases_gil=self._stepper.releases_gil,
            prefill_slices=self._admission.prefill_slices,
            prefill_slice_tokens=self._admission.prefill_slice_tokens,
        )
