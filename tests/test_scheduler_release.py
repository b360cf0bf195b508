"""A stopped scheduler, and the engine it holds, are freed by reference counts alone:
no reference cycle runs through the scheduler and its collaborators. An unloaded model's
pipeline then goes the moment the server lets go of it, without the full collection
that pauses the event loop for every object the process has (ovtrio/serving/service.py).
In process, over the fake engine, with both ways of stepping."""

from __future__ import annotations

import gc
import weakref

import pytest
import trio

from fake_engine import received, request, start_scheduler
from ovtrio.scheduler import Completed


@pytest.mark.parametrize("gil_free", [False, True], ids=["binding-step", "gil-free-runs"])
async def test_a_stopped_scheduler_and_its_engine_go_with_their_last_reference(nursery, gil_free):
    engine = await start_scheduler(nursery, gil_free=gil_free)
    for _ in range(3):
        outputs = await received(engine.scheduler, request(3))
        assert isinstance(outputs[-1], Completed)
    scheduler = weakref.ref(engine.scheduler)
    pipeline = weakref.ref(engine.pipeline)
    engine.stop()
    with trio.fail_after(10):
        while engine.scheduler.stats().step_in_flight:
            await trio.sleep(0.01)
        await trio.sleep(0.05)  # the loop's task ends
    gc.collect()  # what the test's own machinery left behind, before the check
    gc.disable()
    try:
        del engine, outputs
        assert scheduler() is None, gc.get_referrers(scheduler())
        assert pipeline() is None
    finally:
        gc.enable()
