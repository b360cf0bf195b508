"""Taking queued requests into the continuous-batching engine, between two steps.

The loop (scheduler.py) calls `admit()` and `advance_prefills()` between steps: the
oldest queued requests go in while the running sequences leave room for them
(admission.py says how much room), each as its engine requests (one per prompt and
sibling, or one beam search per prompt), and a request with a long prompt first as
growing prefixes of it, one slice a step (prefill.py).

Before any of that, at submission, a request's output constraint is compiled
(`prepared`, constraints/check.py): one that does not compile is the client's 400,
one that does reaches the engine as the grammar compiled, so that nothing the request
brings can make an engine step throw (engine_step.py says why that matters).

`add_request()` is only safe between steps (scheduler.py's docstring says why): every
call here checks that no step is in flight (`between_steps`). A vision-language model's
engine preprocesses and encodes a request's images inside `add_request()`, and the
binding holds the GIL throughout (a Python thread stands still for the whole call:
docs/benchmarks.md#images): the images arrive already brought down to the model's size
(images/load.py), so what is left is the vision encoder's own time. The loop makes those calls in a worker thread
(`add_image_requests`), still between steps, so that a binding that releases the GIL
lets the event loop run meanwhile with no change here.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import trio

from ovtrio.constraints.check import (
    CheckerBusy,
    CheckerClosed,
    ConstraintRefused,
    GrammarChecker,
    GrammarLimits,
    grammar_vocabulary,
)
from ovtrio.engine.errors import client_reason
from ovtrio.engine.tensors import prompt_tensor
from ovtrio.scheduler.admission import Overloaded
from ovtrio.scheduler.intake import NotAccepting, RequestIntake
from ovtrio.scheduler.params import (
    GenerationRequest,
    OutputConstraint,
    SamplingParams,
    UnsupportedParams,
    engine_prompt,
    to_generation_config,
)
from ovtrio.scheduler.prefill import SlicedPrefill, prefills_whole, slice_params
from ovtrio.scheduler.prefill_policy import PrefillPolicy
from ovtrio.scheduler.requests import ActiveRequest, Admission, EngineRequest, Sequence

log = logging.getLogger("ovtrio.scheduler")


# One add_request call: the prompt (text and image tensors), its settings, its seed offset.
EngineCall = tuple[tuple[str, list[Any]], SamplingParams, int]


def seed_offsets(params: SamplingParams) -> range:
    """The engine requests one prompt becomes, by seed offset: one per choice, or one beam
    search for all of them."""
    return range(1) if params.beam_search else range(params.n)


def grammar_request(constraint: OutputConstraint, stop_token_ids: list[int]) -> dict[str, Any]:
    """What the grammar checker compiles for `constraint`, as the engine will: its
    schema or its tags, and the stop ids the engine's matcher is given."""
    if constraint.json_schema is not None:
        return {"kind": "json_schema", "schema": constraint.json_schema, "stop_token_ids": stop_token_ids}
    return {
        "kind": "structural_tag",
        "tags": [{"begin": tag.begin, "schema": tag.schema, "end": tag.end} for tag in constraint.tags],
        "triggers": list(constraint.triggers),
        "stop_token_ids": stop_token_ids,
    }


class EngineAdmission:
    """How the queued requests of an intake (intake.py) become requests of a
    continuous-batching engine, and what that engine has room for: the scheduler's loop
    calls `admit` and `advance_prefills` between steps, and answers the intake's
    questions of room, load and preparation (EngineSide) from here."""

    def __init__(
        self,
        pipeline: Any,
        intake: RequestIntake,
        between_steps: Callable[[str], None],
        tokenizer: Any,
        vocabulary: Any,
        policy: PrefillPolicy,
        grammar_limits: GrammarLimits,
        prefill_whole_above: int = 0,
    ) -> None:
        """`between_steps(call)` asserts that no engine step is in flight: `call` is
        only safe between steps. `policy` sizes the slices of long prompts
        (prefill_policy.py). Prompts longer than `prefill_whole_above` are prefilled in
        one step (prefill.py; 0: none must be)."""
        self._prefill_whole_above = prefill_whole_above
        self._pipeline = pipeline
        self._intake = intake
        self._between_steps = between_steps
        self._limits = intake.limits
        self.policy = policy
        # Prompt tokens added since the last step (what the next step prefills, short of
        # what the prefix cache holds), for the policy's estimate of a step's cost.
        self._prompt_tokens_added = 0
        # Slices of long prompts added, and their tokens, ever (SchedulerStats).
        self.prefill_slices = 0
        self.prefill_slice_tokens = 0
        import openvino_genai

        self._finished_status = openvino_genai.GenerationStatus.FINISHED
        # Requests in the engine whose long prompts are still being prefilled in slices.
        self._prefilling: dict[int, SlicedPrefill] = {}
        self._model_stop_token_ids = frozenset(pipeline.get_config().stop_token_ids)
        # Engine sequences of the requests in the engine (ActiveRequest.weight).
        self.running_sequences = 0
        # Compiles output constraints before admission (a worker process).
        self._grammars = GrammarChecker(partial(grammar_vocabulary, tokenizer, vocabulary), grammar_limits)
        # Requests with a text prompt (a vision-language model's) admitted in this pass,
        # with their time in the queue: added by `add_image_requests`, off the loop.
        self._image_admissions: list[tuple[Admission, float]] = []
        # The engine requests (or the engine's refusal) that the worker thread made for
        # one of them, taken in order by `_add_request`.
        self._made: deque[Any] = deque()

    @property
    def prefilling(self) -> bool:
        """Whether a long prompt is being prefilled in slices (the loop adds each slice)."""
        return bool(self._prefilling)

    def decoding(self) -> int:
        """Engine sequences of the requests in the engine whose prompts are not being
        prefilled in slices."""
        prefilling = sum(self._intake.active[request_id].weight for request_id in self._prefilling)
        return max(0, self.running_sequences - prefilling)

    def take_prompt_tokens(self) -> int:
        """The prompt tokens added since the last call (the next step's to prefill)."""
        added, self._prompt_tokens_added = self._prompt_tokens_added, 0
        return added

    @property
    def has_image_requests(self) -> bool:
        """Whether `admit` took requests whose engine calls `add_image_requests` makes."""
        return bool(self._image_admissions)

    def close(self) -> None:
        """Stop the grammar checker (the loop has ended)."""
        self._grammars.close()

    # ---- output constraints, before admission -------------------------------------------

    async def prepared(self, request: GenerationRequest) -> GenerationRequest:
        """`request` with its output constraint compiled to the grammar the engine is
        given; UnsupportedParams, naming the field it came from, if it does not compile
        within the limits."""
        constraint = request.params.constraint
        if constraint is None or constraint.grammar is not None:
            return request
        stop = sorted(set(request.params.stop_token_ids) | self._model_stop_token_ids)
        try:
            grammar = await self._grammars.grammar(grammar_request(constraint, stop))
        except CheckerBusy as exc:  # the machine's doing, not the constraint's: retry
            raise Overloaded(
                f"The server could not check the output format in '{constraint.param}' now: {exc}."
                " Please retry after a short wait.",
                max(1, self._intake.retry_hint.seconds()),
            ) from None
        except ConstraintRefused as exc:
            raise UnsupportedParams(
                f"the output format in '{constraint.param}' cannot be used for constrained decoding: {exc}.",
                constraint.param,
            ) from None
        except CheckerClosed:  # the loop has ended (the server is stopping)
            raise NotAccepting("the scheduler is not running") from None
        params = replace(request.params, constraint=replace(constraint, grammar=grammar))
        return replace(request, params=params)

    # ---- room in the engine ---------------------------------------------------------------

    def room(self) -> int:
        return max(0, self._limits.max_running_sequences - self.running_sequences)

    def load(self) -> str:
        waiting = self._intake.waiting
        return f"{self.running_sequences} sequences are running and {waiting} requests are waiting"

    def left(self, active: ActiveRequest, outcome: str | None) -> None:
        # Its sequences make room for the queued requests at the next admission.
        self.running_sequences -= active.weight
        prefill = self._prefilling.pop(active.request_id, None)
        if prefill is not None:
            # Ended while its prompt was prefilled (failed, or its consumer left), before
            # its choices existed: the observer hears of each, and its submitter stops
            # waiting and finds the reason in its channel (or in admission.error).
            if outcome is not None:
                for _ in range(prefill.choices):
                    self._intake.observer.ended(outcome)
            prefill.admission.added.set()

    # ---- admission ------------------------------------------------------------------------

    def admit(self) -> bool:
        """Add waiting requests, oldest first, while the running sequences leave room
        (between steps only); True if the engine got any. A request larger than the
        whole limit runs when nothing else does. A request with a long prompt is only
        registered here: `advance_prefills` adds its first slice, after the requests
        admitted with it (prefill.py)."""
        added = False
        now = time.monotonic()
        while self._intake.queued:
            request_id, admission = next(iter(self._intake.queued.items()))
            active = admission.active
            limit = self._limits.max_running_sequences
            if self.running_sequences and self.running_sequences + active.weight > limit:
                break
            if self._prefills_whole(admission) and self._engine_prefills():
                break  # it waits for a step whose budget is all its own (prefill.py)
            # Register the output state before the engine can produce anything for it.
            del self._intake.queued[request_id]
            self._intake.active[request_id] = active
            self.running_sequences += active.weight
            waited = now - active.submitted_at
            active.added_at = now
            self._intake.retry_hint.observe(waited)
            if admission.request is None:  # a reservation: its holder does the work
                admission.added.set()
                continue
            if admission.generation.texts is not None:
                self._image_admissions.append((admission, waited))
                added = True
            elif not self._register_sliced_prefill(admission, waited):
                self._add_admitted(admission, waited)
                added = True
        return added

    async def add_image_requests(self) -> None:
        """Add the requests with images that `admit` took, their engine calls made in a
        worker thread (between steps: the loop starts no step until this returns), then
        registered here as `_add_admitted` registers any request."""
        admissions, self._image_admissions = self._image_admissions, []
        try:
            for admission, waited in admissions:
                calls = self._engine_calls(admission.generation)
                self._made.extend(await trio.to_thread.run_sync(self._make_engine_requests, calls))
                if admission.active.request_id in self._intake.active:
                    self._add_admitted(admission, waited)
                for made in self._made:  # its consumer left meanwhile: nobody reads them
                    if not isinstance(made, Exception):
                        made.cancel()
                self._made.clear()
        finally:
            # Every submitter goes on, also when the loop ends meanwhile (shutdown): one
            # whose request was not added finds it failed or ended in its channel.
            for admission, _ in admissions:
                admission.added.set()

    def _engine_calls(self, request: GenerationRequest) -> list[EngineCall]:
        """The add_request calls a request with a text prompt becomes, in the order
        `_add_engine_requests` takes them."""
        calls = []
        for text in request.texts or ():
            prompt = engine_prompt(text)
            calls += [(prompt, request.params, offset) for offset in seed_offsets(request.params)]
        return calls

    def _make_engine_requests(self, calls: list[EngineCall]) -> list[Any]:
        """In a worker thread: the engine requests for `calls`, up to the first the engine
        refuses (its UnsupportedParams ends the list)."""
        made: list[Any] = []
        for prompt, params, seed_offset in calls:
            try:
                made.append(self._engine_request(prompt, params, seed_offset))
            except UnsupportedParams as exc:
                made.append(exc)
                break
        return made

    def _prefills_whole(self, admission: Admission) -> bool:
        """Whether a queued request holds a prompt that must be prefilled in one step."""
        if admission.request is None:  # a reservation
            return False
        return any(prefills_whole(len(prompt), self._prefill_whole_above) for prompt in admission.generation.prompts)

    def _engine_prefills(self) -> bool:
        """Whether a prompt is being prefilled in the engine: a request in it that has no
        first token yet, or one whose prompt is still prefilled in slices."""
        return bool(self._prefilling) or any(
            active.parts and not active.sent_first_token for active in self._intake.active.values()
        )

    def _register_sliced_prefill(self, admission: Admission, waited: float) -> bool:
        """Register an admitted request with long prompts to be prefilled in slices
        (prefill.py); False if it has none, or one that must be prefilled whole."""
        request = admission.generation
        threshold = self.policy.slice_tokens
        # A text prompt (a vision-language model's) goes to the engine whole.
        if not threshold or request.texts is not None or self._prefills_whole(admission):
            return False
        long_prompts = [prompt for prompt in request.prompts if len(prompt) > threshold]
        if not long_prompts:
            return False
        prefill = SlicedPrefill(admission, long_prompts, slice_params(request.params))
        self._prefilling[admission.active.request_id] = prefill
        # It is in the engine from its first slice on: its wait for room ends here.
        for _ in range(prefill.choices):
            self._intake.observer.queued(waited)
        return True

    def _add_admitted(self, admission: Admission, waited: float | None) -> None:
        """Add the engine requests of an admitted request, and let its submitter go on;
        `waited`, its time in the queue, unless already reported (a sliced prefill)."""
        active = admission.active
        try:
            request = admission.generation
            for prompt_ids in request.prompts:
                self._add_engine_requests(active, prompt_ids, request.params)
        except UnsupportedParams as exc:
            admission.error = exc
            self._intake.abort(active.request_id, None)
        else:
            self._intake.prompt_tokens += active.prompt_tokens
            if waited is not None:  # added whole: the next step prefills all of it
                self._prompt_tokens_added += sum(map(len, request.prompts))
                for _ in active.sequences:
                    self._intake.observer.queued(waited)
        admission.added.set()

    def _add_engine_requests(self, active: ActiveRequest, prompt_ids: list[int], params: SamplingParams) -> None:
        # A request with a text prompt had its engine requests made already (`_made`).
        prompt = None if self._made else prompt_tensor(prompt_ids)

        def new_sequences(count: int) -> list[Sequence]:
            made = [
                self._intake.delivery.new_sequence(len(active.sequences) + i, prompt_ids, params) for i in range(count)
            ]
            active.sequences.extend(made)
            return made

        beam = params.beam_search
        for offset in seed_offsets(params):
            sequences = new_sequences(params.n if beam else 1)
            handle = self._add_request(prompt, params, offset)
            active.parts.append(EngineRequest(handle, sequences, beam_search=beam))

    def _add_request(self, prompt: Any, params: SamplingParams, seed_offset: int) -> Any:
        if self._made:  # made in a worker thread by `add_image_requests`
            made = self._made.popleft()
            if isinstance(made, UnsupportedParams):
                raise made
            return made
        return self._engine_request(prompt, params, seed_offset)

    def _engine_request(self, prompt: Any, params: SamplingParams, seed_offset: int) -> Any:
        """One engine request: `prompt` is a token tensor, or text and image tensors
        (engine_prompt). The engine's refusal of the settings is an UnsupportedParams."""
        self._between_steps("add_request")
        try:
            config = to_generation_config(
                params, seed_offset=seed_offset, model_stop_token_ids=self._model_stop_token_ids
            )
            if isinstance(prompt, tuple):
                return self._pipeline.add_request(self._intake.next_id(), *prompt, config)
            return self._pipeline.add_request(self._intake.next_id(), prompt, config)
        except Exception as exc:  # noqa: BLE001 (whatever the binding raises fails this request alone)
            # The engine raises RuntimeError for what its checks refuse, but the binding
            # lets others through too (IndexError from a std::stoul in the prompt's
            # parsing, ValueError, OverflowError, TypeError): any of them would otherwise
            # end the loop, and with it every request and the model.
            reason = client_reason(exc)
            if not isinstance(exc, RuntimeError):  # a bare C++ library message, such as "stoul"
                reason = f"{type(exc).__name__}: {reason}"
            log.warning("the engine refused a request: %s", reason)
            raise UnsupportedParams(reason) from None

    # ---- long prompts in slices -----------------------------------------------------------

    def _add_prefix(self, active: ActiveRequest, prefill: SlicedPrefill, size: int) -> bool:
        """Add the engine request for the next prefix of a prompt prefilled in slices,
        `size` tokens longer than the last (the policy's slice); False if none is left. It
        is one of the request's parts with no choices of its own (delivery.py reads
        nothing from it, and fails the request if the engine drops it)."""
        prefix = prefill.next_prefix(size)
        if prefix is None:
            return False
        params = prefill.params
        assert params is not None, "a sliced prefill is registered with its slices' settings"
        handle = self._add_request(prompt_tensor(prefix), params, 0)
        prefill.running = EngineRequest(handle, [])
        active.parts.append(prefill.running)
        return True

    def advance_prefills(self, arrivals: bool) -> bool:
        """For each request prefilled in slices that has no prefix running (just
        admitted, or the engine finished its last one; between steps): add the next
        prefix, or the request itself once none is left, in the slice the policy gives
        it (prefill_policy.py; oldest first, a slice of 0 waits a step). With
        `arrivals` (requests were just added whole), the next slice waits one step,
        once in a row: the new requests' first step is then a light one, so a short
        request gets its first token within one decode step of the slice that was
        running when it came. True if the engine got anything."""
        ready: list[tuple[int, SlicedPrefill]] = []
        for request_id, prefill in self._prefilling.items():
            active = self._intake.active[request_id]
            running = prefill.running
            if running is not None:
                self._between_steps("a handle's get_status")
                if running.handle.get_status() != self._finished_status:
                    continue
                active.parts.remove(running)
                running.handle = None
                prefill.running = None
            if arrivals and not prefill.gave_way:
                prefill.gave_way = True
                continue
            prefill.gave_way = False
            ready.append((request_id, prefill))
        sizes = self.policy.slices([prefill.remaining for _, prefill in ready], self.decoding())
        advanced = False
        for (request_id, prefill), size in zip(ready, sizes, strict=True):
            if not size:
                continue
            advanced = True
            left = prefill.remaining
            try:
                sliced = self._add_prefix(self._intake.active[request_id], prefill, size)
            except UnsupportedParams as exc:  # the engine refused the slice's request
                prefill.admission.error = exc
                self._intake.abort(request_id, None)
                continue
            computed = left - prefill.remaining if sliced else left
            self._prompt_tokens_added += computed
            self.prefill_slices += 1
            self.prefill_slice_tokens += computed
            if not sliced:
                del self._prefilling[request_id]
                self._add_admitted(prefill.admission, None)
        return advanced
