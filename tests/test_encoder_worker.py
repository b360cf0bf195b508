"""The encoder worker's own logic, with a stand-in for the model (no engine here; the
real model is driven in test_embeddings.py): batches up to the limit, a full queue
refuses, a job whose client left is never computed, one job's error stays its own."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
import trio

from ovtrio.embedding.worker import EncoderUnavailable, EncoderWorker, Job
from ovtrio.scheduler import Overloaded


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
