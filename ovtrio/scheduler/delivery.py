"""The output side of the loop: after each step, read what the engine produced for every
request, turn the new token ids into text, cut stop strings, and send each request its
delta, holding deltas back over a few steps when many streams are open.

The Scheduler owns one Delivery and calls it from its loop task: `read_outputs()` when
no step is in flight (handle reads are safe only between steps), or `outputs_from()` on
what the worker of a run read between two of its steps (reads.py's `read_engine()`, on
the `read_plan()` taken when the run began); `deliver()` with a GIL-free step while the
next step runs (it calls the tokenizer only, which is safe during a step). Neither
cancels nor ends a request itself: what they decide comes back as Decisions, which the
loop carries out (RequestIntake.apply). scheduler.py's docstring lists every engine call
and why it is safe where it is made.

It also reports each choice's token timings and its end to the scheduler's
RequestObserver (observer.py). The timings are those of the read: one clock reading per
step, taken by `read_engine()`, stands for every output of that step, so recording
costs a subtraction and an observer call per choice and step, small beside a step even
at the largest batch (`python -m bench observer_cost`; see docs/benchmarks.md#metrics-recording).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ovtrio.scheduler.observer import RequestObserver
from ovtrio.scheduler.outputs import TOKEN_OUTSIDE_VOCABULARY, Completed, Delta, Failed, RequestTimings
from ovtrio.scheduler.params import SamplingParams
from ovtrio.scheduler.reads import EngineReads, PlannedRead, StepOutput, joined, read_engine
from ovtrio.scheduler.requests import ActiveRequest, EngineRequest, Sequence
from ovtrio.scheduler.speculation import SpeculationTally
from ovtrio.scheduler.text_output import (
    Detokenizer,
    IncrementalDetokenizer,
    StopMatcher,
    VocabularyDetokenizer,
    decode_batch,
)


@dataclass(slots=True)
class Decisions:
    """What reading and delivering decided for the engine, for the loop to carry out
    (RequestIntake.apply): engine requests to cancel (a stop string ended their only
    choice), and requests to end, each with the outcome its unfinished choices are
    reported with ("abort": completed or its consumer left, "error": the engine failed
    it). Delivery itself neither cancels nor ends anything."""

    cancels: list[EngineRequest] = field(default_factory=list)
    ends: dict[int, str] = field(default_factory=dict)  # request id: outcome, in order

    def end(self, request_id: int, outcome: str) -> None:
        self.ends.setdefault(request_id, outcome)


def _finish_reason_names() -> dict[Any, str]:
    import openvino_genai

    reasons = openvino_genai.GenerationFinishReason
    return {reasons.STOP: "stop", reasons.LENGTH: "length"}


def _generation_status() -> Any:
    import openvino_genai

    return openvino_genai.GenerationStatus


class Delivery:
    def __init__(
        self,
        tokenizer: Any,
        vocabulary: Any,
        stream_interval: int,
        active: dict[int, ActiveRequest],
        observer: RequestObserver,
        vocabulary_size: int | None = None,
    ) -> None:
        """`active` is the scheduler's table of running requests (read, never changed
        here: the requests to end come back as Decisions). `observer` hears each
        choice's timings and end. See Scheduler for `vocabulary`, `stream_interval`
        and `vocabulary_size`."""
        self._tokenizer = tokenizer
        # Ids from here on have no text: the byte table's size, else the detokenizer's.
        self._vocabulary_size = len(vocabulary.token_bytes) if vocabulary is not None else vocabulary_size
        self._observer = observer
        self._read_at = 0.0  # when the outputs of the last read_outputs() were read
        self._vocabulary = vocabulary
        self._configured_interval = stream_interval
        self._active = active
        self._holding: set[Sequence] = set()
        self._reasons = _finish_reason_names()
        status = _generation_status()
        self._finished_status = status.FINISHED
        self._failed_statuses = {
            status.IGNORED: (
                "the request does not fit in the KV cache; retry later or send a shorter one",
                "out_of_memory",
            ),
        }
        self.generated_tokens = 0

    def new_sequence(self, index: int, prompt_ids: list[int], params: SamplingParams) -> Sequence:
        """The output state of one choice of a request about to be added."""
        return Sequence(
            index,
            self._detokenizer(prompt_ids, params),
            StopMatcher(params.stop, params.include_stop_str_in_output),
            prompt_tokens=len(prompt_ids),
            speculation=SpeculationTally(params, prompt_ids) if params.speculative else None,
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

    def forget(self, sequences: list[Sequence]) -> None:
        """Drop what an ended request still held."""
        self._holding.difference_update(sequences)

    def read_outputs(self) -> tuple[list[StepOutput], Decisions]:
        """Read what every handle holds (between steps only), as outputs_from() does. A
        paused request's handles are left alone: its tokens wait there, as ids, until
        its consumer catches up."""
        return self.outputs_from(read_engine(self.read_plan()))

    def read_plan(self) -> list[PlannedRead]:
        """The engine requests to read after a step: those of every request not paused
        that are not done, each with its handle (so a request that ends meanwhile, which
        drops its handles, is still read safely; its outputs are then ignored)."""
        return [
            PlannedRead(active, part, part.handle)
            for active in self._active.values()
            if active.paused_at is None
            for part in active.parts
            if not part.done and part.handle is not None
        ]

    def outputs_from(self, reads: EngineReads) -> tuple[list[StepOutput], Decisions]:
        """The step outputs of what read_engine() read, and the requests the engine
        failed (each is sent Failed here; the loop ends it). Outputs read for a request
        that has paused since are kept in its engine request and come first once it is
        read again."""
        self._read_at = reads.read_at
        fresh: list[StepOutput] = []
        decisions = Decisions()
        for entry in reads.entries:
            active, part, outputs = entry.active, entry.part, entry.outputs
            # A request failed earlier in this read or ended since: skip its parts.
            if part.done or active.request_id not in self._active or active.request_id in decisions.ends:
                continue
            if part.unread:
                outputs, part.unread = joined(part.unread, outputs), []
            if active.paused_at is not None:
                part.unread = outputs
                continue
            for sequence, output in zip(part.sequences, outputs):
                logprobs = output.logprobs if active.logprobs else []
                fresh.append(
                    StepOutput(active, part, sequence, output.ids, logprobs, self._reasons.get(output.finish_reason))
                )
            if entry.status in self._failed_statuses:
                # What its other parts produced is dropped by deliver(): it has ended.
                active.send(Failed(*self._failed_statuses[entry.status]))
                decisions.end(active.request_id, "error")
                continue
            if entry.status == self._finished_status and not outputs:
                # Finished with nothing left to read: close what never saw a reason.
                fresh.extend(
                    StepOutput(active, part, s, [], [], "stop") for s in part.sequences if s.finish_reason is None
                )
        return fresh, decisions

    def deliver(self, fresh: list[StepOutput], steps: int) -> Decisions:
        """Detokenize all new ids in one batch and send each request its delta; `steps`
        is the number of engine steps so far, which decides the flush steps. `fresh` is
        what the last read returned: its tokens are timed at that read. Returns what the
        loop is to cancel and end.

        With a GIL-free step this runs while the next step is in flight: it calls no
        engine method but the tokenizer's (safe then, see scheduler.py).
        """
        decisions = Decisions()
        fresh = [output for output in fresh if self._has_text(output, decisions)]
        if not fresh:
            return decisions
        ended = decisions.ends
        detokenizers = []
        for output in fresh:
            output.sequence.detokenizer.append(output.ids)
            detokenizers.append(output.sequence.detokenizer)
        texts = decode_batch(self._tokenizer, detokenizers)

        flush = steps % self._stream_interval() == 0
        observer, read_at = self._observer, self._read_at
        for output, text in zip(fresh, texts):
            active, part, sequence, ids, reason = (
                output.active,
                output.part,
                output.sequence,
                output.ids,
                output.finish_reason,
            )
            if active.request_id not in self._active or active.request_id in ended:
                continue
            if sequence.finish_reason is not None:
                continue
            first = not active.sent_first_token
            active.sent_first_token = True
            if ids:
                if sequence.last_token_at is None:
                    sequence.first_token_at = read_at
                    observer.first_token(read_at - active.submitted_at)
                else:
                    observer.inter_token(read_at - sequence.last_token_at)
                sequence.last_token_at = read_at
                if sequence.speculation is not None:
                    tally = sequence.speculation.step(ids)
                    if tally is not None:
                        observer.speculated(tally.drafted, tally.accepted)
            sequence.generated += len(ids)
            self.generated_tokens += len(ids)
            text, matched = sequence.stops.feed(text)
            if matched is not None:
                reason = "stop"
                sequence.stop = matched
                if len(part.sequences) == 1:
                    decisions.cancels.append(part)  # a stop string ended it: free the engine's work
                    part.done = True
            elif reason is not None:
                text += sequence.stops.flush()
            sequence.finish_reason = reason
            if reason is not None:
                self._observe_finish(active, sequence, reason, read_at)
            if all(s.finish_reason is not None for s in part.sequences):
                part.done = True
            sequence.held_text += text
            sequence.held_ids.extend(ids)
            if active.logprobs:
                sequence.held_logprobs = (sequence.held_logprobs or []) + output.logprobs
            # The first token and the last always go out at once (time to first token,
            # completion); the ones between may wait for the next flush step.
            if first or reason is not None or flush:
                if not self._release(active, sequence):
                    decisions.end(active.request_id, "abort")  # its consumer left
                    continue
            else:
                self._holding.add(sequence)
            if all(s.finish_reason is not None for s in active.sequences):
                generated = sum(s.generated for s in active.sequences)
                active.send(Completed(active.prompt_tokens, generated, _timings(active)))
                decisions.end(active.request_id, "abort")  # nothing left unfinished to count
        if flush and self._holding:
            for active in list(self._active.values()):
                if active.request_id in ended:
                    continue
                for sequence in active.sequences:
                    if sequence in self._holding and not self._release(active, sequence):
                        decisions.end(active.request_id, "abort")
                        break
        return decisions

    def failed(self, fresh: list[StepOutput], message: str) -> Decisions:
        """Fail the requests `fresh` holds outputs of, when deliver() raised on them (the
        tokenizer failed): they end, the others are untouched."""
        decisions = Decisions()
        for output in fresh:
            active = output.active
            if active.request_id in self._active and active.request_id not in decisions.ends:
                active.send(Failed(message, "engine_error"))
                decisions.end(active.request_id, "error")
        return decisions

    def _has_text(self, output: StepOutput, decisions: Decisions) -> bool:
        """Whether every id of `output` is in the vocabulary. One that is not (an output
        layer with more rows than the vocabulary has tokens) fails its request alone:
        the byte table would raise on it and the engine's detokenizer would drop it
        without a word."""
        active = output.active
        if active.request_id in decisions.ends:
            return False
        size = self._vocabulary_size
        if size is None:
            return True
        outside = next((token_id for token_id in output.ids if not 0 <= token_id < size), None)
        if outside is None:
            return True
        if active.request_id in self._active:
            active.send(
                Failed(
                    f"the model produced token id {outside}, outside its vocabulary of {size} tokens"
                    " (its output layer has more rows than its tokenizer has tokens)",
                    TOKEN_OUTSIDE_VOCABULARY,
                )
            )
            decisions.end(active.request_id, "error")
        return False

    def _observe_finish(self, active: ActiveRequest, sequence: Sequence, reason: str, read_at: float) -> None:
        first, last = sequence.first_token_at, sequence.last_token_at
        per_token = 0.0
        if first is not None and last is not None and sequence.generated > 1:
            per_token = (last - first) / (sequence.generated - 1)
        self._observer.finished(
            reason, sequence.prompt_tokens, sequence.generated, read_at - active.submitted_at, per_token
        )

    def _release(self, active: ActiveRequest, sequence: Sequence) -> bool:
        """Send what `sequence` holds; False if its consumer left (the request is to end)."""
        self._holding.discard(sequence)
        delta = Delta(
            sequence.index,
            sequence.held_text,
            sequence.held_ids,
            sequence.finish_reason,
            sequence.held_logprobs,
            sequence.stop if sequence.finish_reason is not None else None,
        )
        sequence.held_text, sequence.held_ids, sequence.held_logprobs = "", [], None
        return active.send(delta)

    def _stream_interval(self) -> int:
        """Engine steps between deltas to consumers.

        Each delta costs its consumer an HTTP write through Quart, Hypercorn and h11.
        With a step that holds the GIL that is paid between steps while the engine
        waits; with a GIL-free step it runs beside the engine but takes CPU from the
        engine's own threads on a small machine. With many streams that adds up to a
        real share of the engine's time, so by default deltas are merged over two steps
        from 12 streams on and three from 24 on: tokens reach a reader a little less
        often, and the engine keeps its throughput (see
        docs/benchmarks.md#streaming-deltas).
        A configured interval overrides this.
        """
        if self._configured_interval:
            return self._configured_interval
        return min(3, 1 + len(self._active) // 12)


def _timings(active: ActiveRequest) -> RequestTimings:
    """When the request's stages ended, from its choices' token reads."""
    firsts = [s.first_token_at for s in active.sequences if s.first_token_at is not None]
    lasts = [s.last_token_at for s in active.sequences if s.last_token_at is not None]
    start = active.submitted_at
    return RequestTimings(
        None if active.added_at is None else active.added_at - start,
        min(firsts) - start if firsts else None,
        max(lasts) - start if lasts else None,
    )
