"""The encoder worker's own logic, with a stand-in for the model (no engine here; the
real model is driven in test_embeddings.py): batches up to the limit, a full queue
refuses, a job whose client left is never computed, one job's error stays its own."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from ovtrio.embedding.on_demand import OnDemandEncoder
from ovtrio.embedding.worker import EncoderUnavailable, EncoderWorker, Job
from ovtrio.scheduler import Overloaded
from ovtrio.serving.shutdown import Shutdown
from ovtrio.settings.server import Settings


class GatedModel:
    """Computes each job as the number of its inputs; the first batch waits for `gate`."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.gate = threading.Event()

    def run(self, model: GatedModel, jobs: Sequence[Job]) -> None:
        if not self.batches:
            self.gate.wait(30)
        self.batches.append([job.payload for job in jobs])
        for job in jobs:
            if job.payload == "bad":
                job.error = ValueError("bad input")
            else:
                job.result = job.size


async def _wait_until(condition, timeout: float = 10) -> None:
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.005)


async def test_waiting_jobs_share_a_batch_up_to_the_limit() -> None:
    model = GatedModel()
    worker: EncoderWorker[GatedModel] = EncoderWorker(model.run, max_batch=4, max_queued=10)
    results: dict[str, object] = {}

    async def submit(name: str, size: int) -> None:
        try:
            results[name] = (await worker.submit(Job(name, size))).result
        except ValueError as exc:
            results[name] = str(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.run, model)
        nursery.start_soon(submit, "first", 1)
        await _wait_until(lambda: worker.stats().running == 1)
        for queued, (name, size) in enumerate((("a", 2), ("bad", 1), ("b", 1), ("c", 3)), start=1):
            nursery.start_soon(submit, name, size)
            await _wait_until(lambda queued=queued: worker.stats().queued == queued)
        model.gate.set()
        await _wait_until(lambda: len(results) == 5)
        nursery.cancel_scope.cancel()
    assert model.batches == [["first"], ["a", "bad", "b"], ["c"]]
    assert results == {"first": 1, "a": 2, "bad": "bad input", "b": 1, "c": 3}


async def test_a_full_queue_refuses_and_a_job_whose_client_left_is_not_computed() -> None:
    model = GatedModel()
    worker: EncoderWorker[GatedModel] = EncoderWorker(model.run, max_batch=8, max_queued=2)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.run, model)
        nursery.start_soon(worker.submit, Job("first", 1))
        await _wait_until(lambda: worker.stats().running == 1)
        leaving = trio.CancelScope()

        async def leaver() -> None:
            with leaving:
                await worker.submit(Job("left", 1))

        nursery.start_soon(leaver)
        await _wait_until(lambda: worker.stats().queued == 1)
        nursery.start_soon(worker.submit, Job("stays", 1))
        await _wait_until(lambda: worker.stats().queued == 2)
        with pytest.raises(Overloaded) as refused:
            await worker.submit(Job("refused", 1))
        assert refused.value.retry_after >= 1
        leaving.cancel()
        await trio.sleep(0.01)
        model.gate.set()
        await _wait_until(lambda: len(model.batches) == 2)
        nursery.cancel_scope.cancel()
    assert model.batches == [["first"], ["stays"]]


async def test_a_closed_worker_fails_waiting_jobs_and_refuses_new_ones() -> None:
    worker: EncoderWorker[None] = EncoderWorker(lambda model, jobs: None, max_batch=8, max_queued=4)
    failures: list[str] = []

    async def submit() -> None:
        try:
            await worker.submit(Job("x", 1))
        except EncoderUnavailable as exc:
            failures.append(exc.code)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit)
        await _wait_until(lambda: worker.stats().queued == 1)
        worker.close(EncoderUnavailable("gone", "model_unavailable"))
    with pytest.raises(EncoderUnavailable):
        await worker.submit(Job("y", 1))
    assert failures == ["model_unavailable"]


class PartedModel:
    """Computes `max_batch` inputs of a job a turn (as the real models do); records each
    batch as (payload, inputs) pairs; the first batch waits for `gate`."""

    def __init__(self, max_batch: int) -> None:
        self.max_batch = max_batch
        self.batches: list[list[tuple[str, int]]] = []
        self.gate = threading.Event()

    def run(self, model: PartedModel, jobs: Sequence[Job]) -> None:
        if not self.batches:
            self.gate.wait(30)
        batch = []
        for job in jobs:
            left = job.size if job.left < 0 else job.left
            part = min(left, self.max_batch)
            batch.append((job.payload, part))
            job.left = left - part
            if job.left:
                job.more = True
            else:
                job.result = job.size
        self.batches.append(batch)


async def test_a_large_job_goes_a_batch_at_a_time_behind_what_came_meanwhile() -> None:
    model = PartedModel(max_batch=4)
    worker: EncoderWorker[PartedModel] = EncoderWorker(model.run, max_batch=4, max_queued=1)
    finished: list[str] = []

    async def submit(name: str, size: int) -> None:
        await worker.submit(Job(name, size))
        finished.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.run, model)
        nursery.start_soon(submit, "large", 12)
        await _wait_until(lambda: worker.stats().running == 1)
        # The large job in the thread holds no place of the queue: one more waits.
        nursery.start_soon(submit, "small", 1)
        await _wait_until(lambda: worker.stats().queued == 1)
        model.gate.set()
        await _wait_until(lambda: len(finished) == 2)
        nursery.cancel_scope.cancel()
    assert finished == ["small", "large"]
    assert model.batches == [[("large", 4)], [("small", 1)], [("large", 4)], [("large", 4)]]


async def test_a_large_job_whose_client_left_stops_after_its_batch() -> None:
    model = PartedModel(max_batch=4)
    worker: EncoderWorker[PartedModel] = EncoderWorker(model.run, max_batch=4, max_queued=4)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.run, model)
        with trio.move_on_after(0.2):  # the client leaves while its first batch runs
            await worker.submit(Job("large", 12))
        model.gate.set()
        await _wait_until(lambda: len(model.batches) == 1 and worker.stats().running == 0)
        await trio.sleep(0.2)
        nursery.cancel_scope.cancel()
    assert model.batches == [[("large", 4)]]


class PartedEncoder(OnDemandEncoder[PartedModel]):
    """An encoder loaded on demand whose model is `model` (its loads counted)."""

    kind = "embedding"

    def __init__(self, model: PartedModel) -> None:
        super().__init__("parted", Settings(), None, EncoderWorker(model.run, max_batch=4, max_queued=4))
        self.stand_in = model
        self.loads = 0

    def _load(self) -> PartedModel:
        self.loads += 1
        return self.stand_in


def test_a_large_job_between_two_of_its_parts_keeps_its_model_busy() -> None:
    """Between two parts the job holds no place of the queue, and no batch runs: the
    model is still not idle, or an idle or LRU unload would take it away mid-job."""
    encoder = PartedEncoder(PartedModel(max_batch=4))
    encoder.loaded.set()
    job = encoder.worker.enqueue(Job("large", 10))
    job.left = 6  # its first part computed, it waits in the queue for its next
    assert encoder.stats().queued == 0 and encoder.stats().running == 0
    assert not encoder.idle


@asynccontextmanager
async def _loaded(encoder: PartedEncoder) -> AsyncIterator[trio.Nursery]:
    """A nursery in which `encoder` runs, once its model is loaded."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(encoder.run)
        encoder.want()
        await _wait_until(encoder.loaded.is_set)
        yield nursery


async def _submitted(encoder: PartedEncoder, job: Job, results: list[object]) -> None:
    results.append((await encoder.worker.submit(job)).result)


async def test_an_encoder_unloaded_in_the_middle_of_a_large_job_loads_again_and_finishes_it() -> None:
    """An unload of a busy encoder (a drain past its timeout): the part in the thread
    ends, and the rest of the job loads the model again."""
    model = PartedModel(max_batch=4)
    encoder = PartedEncoder(model)
    results: list[object] = []
    async with _loaded(encoder) as nursery:
        nursery.start_soon(_submitted, encoder, Job("large", 12), results)
        await _wait_until(lambda: encoder.stats().running == 1)
        assert encoder.unload(busy=True)
        model.gate.set()
        with trio.fail_after(10):
            await _wait_until(lambda: results == [12])
        nursery.cancel_scope.cancel()
    assert encoder.loads == 2
    assert sum(inputs for batch in model.batches for _, inputs in batch) == 12


async def test_a_batch_cancelled_before_its_thread_began_goes_back_to_the_queue() -> None:
    """An unload may come after the worker took a batch from the queue and before its
    thread began (it waits for its thread there): the batch is computed after the next
    load, never answered as done with nothing computed."""
    model = PartedModel(max_batch=4)
    model.gate.set()
    encoder = PartedEncoder(model)
    results: list[object] = []
    async with _loaded(encoder) as nursery:
        thread = encoder.worker._thread
        await thread.acquire()  # the worker's thread is taken: its batch waits for it
        nursery.start_soon(_submitted, encoder, Job("small", 2), results)
        await _wait_until(lambda: encoder.stats().running == 1)
        assert encoder.unload(busy=True)
        await _wait_until(lambda: encoder.loads == 2 and encoder.stats().running == 1)
        assert results == []
        thread.release()
        await _wait_until(lambda: results == [2])
        nursery.cancel_scope.cancel()
    assert model.batches == [[("small", 2)]]


async def _drained_jobs(encoder: PartedEncoder, sizes: dict[str, int], *, cut: bool) -> dict[str, object]:
    """Each job of `sizes` submitted to `encoder` (loaded), the first in its thread and
    the others queued, then the drain begun, and `cut` short while the thread still
    computes (a second signal) or not: what each job ended with."""
    shutdown = Shutdown(drain_timeout=60)
    results: dict[str, object] = {}

    async def submit(name: str, size: int) -> None:
        try:
            results[name] = (await encoder.worker.submit(Job(name, size))).result
        except EncoderUnavailable as exc:
            results[name] = exc.code

    async with trio.open_nursery() as nursery:
        nursery.start_soon(encoder.run)
        encoder.want()
        await _wait_until(encoder.loaded.is_set)
        for queued, (name, size) in enumerate(sizes.items()):
            nursery.start_soon(submit, name, size)
            await _wait_until(lambda queued=queued: encoder.stats().running == 1 and encoder.stats().queued == queued)
        nursery.start_soon(shutdown.drain, [encoder.for_shutdown()], "test")
        await trio.testing.wait_all_tasks_blocked()
        assert shutdown.draining.is_set() and not shutdown.drained.is_set()
        if cut:
            shutdown.hurry()
        else:
            encoder.stand_in.gate.set()  # the batch in the thread ends: the drain waits for the rest
        with trio.fail_after(10):
            await shutdown.drained.wait()
            await _wait_until(lambda: len(results) == len(sizes))
        encoder.stand_in.gate.set()
        nursery.cancel_scope.cancel()
    return results


async def test_the_drain_waits_for_an_encoders_jobs_even_between_two_parts() -> None:
    """Jobs computing, queued, and a large one between its parts all run to their end."""
    encoder = PartedEncoder(PartedModel(max_batch=4))
    results = await _drained_jobs(encoder, {"large": 12, "small": 1}, cut=False)
    assert results == {"large": 12, "small": 1}


async def test_an_encoders_jobs_left_when_the_drain_ends_hear_that_the_server_stops() -> None:
    """Cut (by a second signal here; the timeout does the same): the job in the thread and
    the one queued end with shutting_down at once, not when the batch ends."""
    encoder = PartedEncoder(PartedModel(max_batch=4))
    results = await _drained_jobs(encoder, {"large": 12, "small": 1}, cut=True)
    assert results == {"large": "shutting_down", "small": "shutting_down"}


async def test_jobs_waiting_for_their_encoders_load_hear_at_once_that_the_server_stops() -> None:
    encoder = PartedEncoder(PartedModel(max_batch=4))  # not loaded, not loading yet
    refused: list[str] = []

    async def submit() -> None:
        try:
            await encoder.worker.submit(Job("waits", 1))
        except EncoderUnavailable as exc:
            refused.append(exc.code)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit)
        await _wait_until(lambda: encoder.stats().queued == 1)
        with trio.fail_after(1):
            await Shutdown(drain_timeout=60).drain([encoder.for_shutdown()], "test")
    assert refused == ["shutting_down"]
    assert encoder.worker.jobs == 0
