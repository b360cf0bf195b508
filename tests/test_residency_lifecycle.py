"""The residency's and the model service's lifecycle where a real server cannot reach
the timing: a client that leaves while its unload drains or stops the engine, a
scheduler that dies while serving, the server's stop under a waiting load, a load that
raises before it runs, a file unusable when first read, a model loaded at start under
--model-idle-unload, and the lifecycle counters. Pure logic: the service's engine part
(_serve) is a small fake that serves until told to fail; everything else is the real
ModelService and Residency."""

from __future__ import annotations

import dataclasses
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing

from ovtrio.api.protocol.keep_alive import seconds_of
from ovtrio.embedding.on_demand import OnDemandEncoder
from ovtrio.embedding.worker import EncoderWorker
from ovtrio.lifecycle import load_retry
from ovtrio.lifecycle.load_retry import FailedLoad
from ovtrio.scheduler.interface import SchedulerStats
from ovtrio.serving.residency import Busy, LoadFailed, NoRoom, Residency, ResidencyRules, Stopping
from ovtrio.serving.service import ModelService
from ovtrio.settings.server import Settings


class FakeScheduler:
    """Runs `in_flight` requests until `finished` is set."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.draining = False
        self.finished = trio.Event()

    def drain(self) -> None:
        self.draining = True

    async def idle(self) -> None:
        if self.in_flight:
            await self.finished.wait()
            self.in_flight = 0

    def fail_all(self, message: str, code: str) -> int:
        cut, self.in_flight = self.in_flight, 0
        return cut

    def stats(self) -> Any:
        fields = {field.name: 0 for field in dataclasses.fields(SchedulerStats)}
        return SchedulerStats(**{**fields, "step_in_flight": False, "step_releases_gil": False})


@dataclasses.dataclass
class FakeServing:
    scheduler: FakeScheduler


class FakeService(ModelService):
    """A model whose load takes no time and whose scheduler serves until `dies` is set."""

    def __init__(self, name: str, on_demand: bool = True) -> None:
        super().__init__(Settings(), on_demand=on_demand)
        self.source = SimpleNamespace(name=name, path=None)  # type: ignore[assignment]
        self.dies = trio.Event()
        self.runs = 0

    def files_changed(self) -> bool:
        return False  # a stand-in source: nothing to read again before a load

    async def _serve(self, source: Any) -> None:
        self.runs += 1
        await trio.lowlevel.checkpoint()
        self.load_seconds = 0.01
        self.serving = FakeServing(FakeScheduler())  # type: ignore[assignment]
        self.ready.set()
        await self.dies.wait()
        self.failure = "its scheduler stopped"
        self.failed.set()


class FakeMetrics:
    def __init__(self) -> None:
        self.loads: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.unloads: Counter[str] = Counter()
        self.reasons: list[str] = []

    def loaded(self, model_name: str, seconds: float) -> None:
        self.loads[model_name] += 1

    def load_failed(self, model_name: str) -> None:
        self.failures[model_name] += 1

    def unloaded(self, model_name: str, reason: str) -> None:
        self.unloads[model_name] += 1
        self.reasons.append(reason)


def rules(models_max: int = 1, idle_unload: float | None = None) -> ResidencyRules:
    return ResidencyRules(models_max, autoload=True, load_wait=1.0, idle_unload=idle_unload, drain_timeout=30.0)


async def started(nursery: trio.Nursery, *services: ModelService, **kwargs: Any) -> tuple[Residency, FakeMetrics]:
    metrics = FakeMetrics()
    residency = Residency(lambda: services, rules(**kwargs), metrics)  # type: ignore[arg-type]
    await nursery.start(residency.run)
    return residency, metrics


async def wait_until(condition: Any) -> None:
    with trio.fail_after(120):
        while not condition():
            await trio.sleep(0.01)


async def test_an_unload_whose_client_leaves_while_the_model_drains_still_ends(nursery):
    """The client of POST /models/unload leaves while the model's request finishes:
    the unload goes on (it was left loaded, refusing every request, for good)."""
    alpha = FakeService("alpha")
    residency, metrics = await started(nursery, alpha)
    serving = await residency.acquire(alpha)
    serving.scheduler.in_flight = 1
    with trio.move_on_after(0.1) as left:
        await residency.unload(alpha, "request")
    assert left.cancelled_caught  # it left during the drain
    serving.scheduler.finished.set()
    await wait_until(lambda: alpha.state == "unloaded")
    assert alpha.serving is None
    # And the next request loads it again, to a scheduler that takes requests.
    with trio.fail_after(120):
        again = await residency.acquire(alpha)
    assert again is not serving and not again.scheduler.draining
    await wait_until(lambda: metrics.loads["alpha"] == 2)
    assert metrics.unloads["alpha"] == 1


async def test_an_unload_whose_client_leaves_while_the_engine_stops_leaves_it_unloaded(nursery):
    alpha, beta = FakeService("alpha"), FakeService("beta")
    residency, _ = await started(nursery, alpha, beta)
    await residency.acquire(alpha)
    with trio.CancelScope() as left:
        left.cancel()  # gone before the unload awaits anything
        await residency.unload(alpha, "request")
    await wait_until(lambda: alpha.state == "unloaded")
    assert alpha.serving is None
    with trio.fail_after(120):
        await residency.acquire(beta)


async def test_a_model_whose_scheduler_died_is_unloaded_by_hand_and_another_takes_its_room(nursery):
    alpha, beta = FakeService("alpha"), FakeService("beta")
    residency, metrics = await started(nursery, alpha, beta)
    await residency.acquire(alpha)
    alpha.dies.set()
    await wait_until(lambda: alpha.state == "failed" and alpha.serving is None)
    assert metrics.unloads["alpha"] == 1 and metrics.reasons == ["failed"]  # its engine went
    assert await residency.unload(alpha, "request") == 0
    assert alpha.state == "unloaded"  # it was "loaded" with no engine
    with trio.fail_after(120):
        await residency.acquire(beta)
    assert metrics.loads["alpha"] - metrics.unloads["alpha"] == 0


async def test_a_model_the_server_stopped_is_not_loaded_and_takes_no_room(nursery):
    """The server's close() stops a model while a load waits for room: the model is
    no longer loaded (it was, with no engine, and the load's search for room spun
    without yielding)."""
    alpha, beta = FakeService("alpha"), FakeService("beta")
    residency, metrics = await started(nursery, alpha, beta)
    await residency.acquire(alpha)
    with trio.fail_after(120):
        await alpha.close()
    assert alpha.state == "unloaded"
    assert metrics.unloads["alpha"] == 1 and metrics.reasons == ["stopped"]
    with trio.fail_after(120):
        await residency.acquire(beta)


async def test_a_search_for_room_whose_unload_changes_nothing_yields_and_gives_up(nursery, monkeypatch):
    alpha, beta = FakeService("alpha"), FakeService("beta")
    residency, _ = await started(nursery, alpha, beta)
    await residency.acquire(alpha)

    async def unload_nothing(service: ModelService, reason: str, *, wait: bool = True) -> int:
        return 0

    monkeypatch.setattr(residency, "unload", unload_nothing)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.sleep(0.01)

    nursery.start_soon(tick)
    with trio.fail_after(120):
        assert await residency._make_room(beta) is False  # within load_wait (1 s)
    assert ticks > 10  # the event loop went on meanwhile


async def test_a_load_that_raises_before_it_runs_leaves_nothing_to_wait_for(nursery, monkeypatch):
    alpha = FakeService("alpha")
    residency, metrics = await started(nursery, alpha)
    await residency.acquire(alpha)
    await residency.unload(alpha, "request")

    async def broken(loading: Any) -> bool:
        raise RuntimeError("broken")

    monkeypatch.setattr(residency, "_make_room", broken)
    with pytest.raises(LoadFailed, match="broken"):
        await residency.acquire(alpha)
    assert metrics.failures["alpha"] == 1
    with trio.fail_after(120):  # the server's close, or an unload, waits for the cycle to stop
        await alpha.close()
        await residency.unload(alpha, "request")
    assert alpha.state == "unloaded"


async def test_a_file_unusable_when_first_read_loads_once_it_is_usable(nursery):
    """The folder was read while the file was still being copied (failed, before any
    load): the next request loads it, once, and it counts as loaded."""
    alpha, beta = FakeService("alpha"), FakeService("beta")
    alpha.failure = "not a GGUF file (still being copied)"
    alpha.failed.set()
    residency, metrics = await started(nursery, alpha, beta, models_max=1)
    assert alpha.state == "failed"
    with trio.fail_after(120):
        first = await residency.acquire(alpha)
        second = await residency.acquire(alpha)
    assert first is second and alpha.runs == 1
    assert alpha.state == "loaded" and alpha.failure is None
    await wait_until(lambda: metrics.loads["alpha"] == 1)
    with trio.fail_after(120):  # it counts under models_max: beta's load unloads it
        await residency.acquire(beta)
    assert alpha.state == "unloaded"


async def test_a_model_loaded_at_start_keeps_its_idle_time_and_is_counted(nursery):
    """As the registry starts them: the residency first, then the model's own run. Its
    idle time starts when it is loaded (not when trio's clock began)."""
    alpha = FakeService("alpha", on_demand=False)
    _, metrics = await started(nursery, alpha, models_max=0, idle_unload=0.2)
    before_load = trio.current_time()
    await nursery.start(alpha.run)
    await wait_until(lambda: metrics.loads["alpha"] == 1)
    await wait_until(lambda: alpha.state == "unloaded")  # idle: unloaded
    assert metrics.unloads["alpha"] == 1
    assert alpha.last_used >= before_load


async def test_an_idle_unload_that_raises_leaves_the_residency_running(nursery, monkeypatch):
    alpha, beta = FakeService("alpha"), FakeService("beta")
    residency, _ = await started(nursery, alpha, beta, models_max=0, idle_unload=0.5)
    await residency.acquire(alpha)
    await residency.acquire(beta)

    async def broken(*args: Any, **kwargs: Any) -> int:
        raise RuntimeError("broken unload")

    monkeypatch.setattr(alpha, "unload", broken)
    await wait_until(lambda: beta.state == "unloaded")
    assert alpha.state == "loaded"
    await trio.sleep(2 * rules().idle_check)  # looked at again, and again
    await residency.acquire(beta)  # the residency still loads
    assert beta.state == "loaded"


@pytest.mark.parametrize("value", [float("nan"), "nan", "NaN", float("inf"), "-inf", "infinity"])
def test_keep_alive_is_a_finite_number(value):
    with pytest.raises(ValueError, match="finite"):
        seconds_of(value)


class FakeEncoder(OnDemandEncoder[Any]):
    """An encoder whose load takes no time, over the real worker."""

    kind = "embedding"

    def __init__(self, name: str, preload: bool = False) -> None:
        worker: EncoderWorker[Any] = EncoderWorker(lambda model, batch: None, max_batch=4, max_queued=4)
        super().__init__(name, Settings(encoder_preload=preload), None, worker)

    def _load(self) -> Any:
        return SimpleNamespace(load_seconds=0.01)


async def encoder_started(nursery: trio.Nursery, encoder: FakeEncoder, **kwargs: Any) -> tuple[Residency, FakeMetrics]:
    metrics = FakeMetrics()
    encoder.load_observer = metrics
    residency = Residency(list, rules(**kwargs), metrics, lambda: [encoder])  # type: ignore[arg-type]
    await nursery.start(residency.run)
    await nursery.start(encoder.run)
    return residency, metrics


async def test_a_preloaded_encoder_keeps_its_idle_time(nursery):
    """Its idle time starts when it is loaded (not when trio's clock began)."""
    encoder = FakeEncoder("embedder", preload=True)
    before_load = trio.current_time()
    _, metrics = await encoder_started(nursery, encoder, models_max=0, idle_unload=0.2)
    await wait_until(lambda: metrics.loads["embedder"] == 1)
    await wait_until(lambda: encoder.state == "unloaded")
    assert metrics.unloads["embedder"] == 1
    assert encoder.last_used >= before_load


async def test_an_encoder_unloaded_twice_at_once_is_counted_once(nursery):
    encoder = FakeEncoder("embedder")
    residency, metrics = await encoder_started(nursery, encoder)
    await encoder.settled()
    assert encoder.state == "loaded"
    answers: list[bool] = []

    async def unload() -> None:
        answers.append(await residency.unload_encoder(encoder, "request"))

    with trio.fail_after(120):
        async with trio.open_nursery() as both:
            both.start_soon(unload)
            both.start_soon(unload)
    assert answers == [True, True] and encoder.state == "unloaded"
    assert metrics.unloads["embedder"] == 1


class BrokenService(FakeService):
    """A model whose every load fails."""

    async def _serve(self, source: Any) -> None:
        self.runs += 1
        await trio.lowlevel.checkpoint()
        self.failure = "the engine cannot read it"
        self.failed.set()


async def test_a_model_whose_load_failed_is_not_loaded_again_at_once_unless_its_file_changed(
    nursery, monkeypatch, tmp_path
):
    """A client asking again and again for a broken model would hold the one load turn
    all the while: its requests hear the failure, and a load is tried again only after
    a while, or once the file changed."""
    monkeypatch.setattr(load_retry, "RETRY_AFTER", 3600)  # "a while" passes when the test says
    model = tmp_path / "broken.gguf"
    model.write_bytes(b"x")
    broken = BrokenService("broken")
    broken.source = SimpleNamespace(name="broken", path=model)  # type: ignore[assignment]
    residency, metrics = await started(nursery, broken)

    async def ask() -> None:
        with pytest.raises(LoadFailed, match="cannot read"):
            await residency.acquire(broken)
        await wait_until(lambda: broken.runs == metrics.failures["broken"])  # counted: the load has ended

    for _ in range(3):
        await ask()
    assert broken.runs == 1
    model.write_bytes(b"xy")  # copied again
    await ask()
    assert broken.runs == 2
    monkeypatch.setattr(load_retry, "RETRY_AFTER", 0)  # the while has passed
    await ask()
    assert broken.runs == 3
    await residency.unload(broken, "request")  # forgets the failure: the next request loads
    await ask()
    assert broken.runs == 4


async def test_unloads_asked_at_once_unload_the_model_once_and_are_counted_once(nursery):
    """Two clients, or a client and the idle loop, asking in the same moment: one unload,
    one count (loads minus unloads is what is loaded, /v1/models against /metrics)."""
    alpha = FakeService("alpha")
    residency, metrics = await started(nursery, alpha)
    for _ in range(2):
        await residency.acquire(alpha)
        async with trio.open_nursery() as asking:
            for reason in ("request", "request", "idle"):
                asking.start_soon(residency.unload, alpha, reason)
        assert alpha.state == "unloaded"
    assert metrics.loads["alpha"] == 2
    assert sum(metrics.unloads.values()) == 2, metrics.reasons


def test_the_retry_after_of_a_failed_load_is_the_time_left_before_the_next():
    async def main() -> None:
        failure = FailedLoad.now(None)
        assert failure.retry_after() == round(load_retry.RETRY_AFTER)
        await trio.sleep(load_retry.RETRY_AFTER - 2.5)
        assert failure.retry_after() == 3
        await trio.sleep(5)
        assert failure.retry_after() == 1 and not failure.too_soon(None)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


async def test_a_model_forgotten_while_a_request_waits_for_its_unload_is_not_loaded_again(nursery):
    """Its file gone, the registry forgets a model once it is unloaded: a request that
    waited for that unload hears why, rather than loading an engine that no model list,
    /metrics or idle unload would know of."""
    alpha = FakeService("alpha")
    served = [alpha]
    residency = Residency(lambda: served, rules(), FakeMetrics())
    await nursery.start(residency.run)
    serving = await residency.acquire(alpha)
    serving.scheduler.in_flight = 1
    nursery.start_soon(residency.unload, alpha, "request")
    await wait_until(lambda: alpha.state == "unloading")
    served.clear()  # the registry forgets it (the rescan right after the unload, here sooner)
    serving.scheduler.finished.set()
    with pytest.raises(LoadFailed, match="file is gone"):
        await residency.acquire(alpha)
    assert alpha.runs == 1


class SlowService(FakeService):
    """A model whose load ends when `loads` is set."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.loads = trio.Event()

    async def _serve(self, source: Any) -> None:
        await self.loads.wait()
        await super()._serve(source)


async def test_a_request_waiting_for_a_load_when_the_server_stops_is_refused_at_once(nursery):
    """The drain begins while a request waits for its model's load: the request hears
    at once that the server stops (it is not served once the load ends, on a scheduler
    the drain never saw), and the model, once loaded, takes no request."""
    alpha = SlowService("alpha")
    stopping = trio.Event()
    residency = Residency(lambda: [alpha], rules(), FakeMetrics(), stopping=stopping)  # type: ignore[arg-type]
    await nursery.start(residency.run)
    outcome: list[str] = []

    async def request() -> None:
        try:
            await residency.acquire(alpha)
            outcome.append("served")
        except Stopping:
            outcome.append("stopping")

    nursery.start_soon(request)
    await wait_until(lambda: alpha.state == "loading")
    stopping.set()
    await wait_until(lambda: outcome == ["stopping"])
    assert alpha.state == "loading"  # refused before the load ended
    alpha.loads.set()
    await wait_until(lambda: alpha.serving is not None)
    await wait_until(lambda: alpha.serving.scheduler.draining)


async def test_a_model_with_a_lease_out_is_neither_idle_nor_unloaded_to_make_room(nursery):
    """A request holds its model from the moment it is handed over (before it submits
    anything): no idle unload and no load making room takes it away meanwhile; once
    the lease is given back, its idle time starts then."""
    alpha, beta = FakeService("alpha"), FakeService("beta")
    residency, metrics = await started(nursery, alpha, beta, idle_unload=0.2)
    serving, lease = await residency.take_lease(alpha)
    assert serving.scheduler.in_flight == 0  # nothing submitted: only the lease holds it
    with pytest.raises(NoRoom):  # beta's load waits load_wait (1 s) for room, and finds none
        await residency.acquire(beta)
    assert alpha.state == "loaded" and metrics.unloads["alpha"] == 0
    returned_at = trio.current_time()
    lease.release()
    lease.release()  # a second release gives nothing back twice
    assert alpha.leases.held == 0 and alpha.last_used >= returned_at
    await wait_until(lambda: alpha.state == "unloaded")  # idle now: unloaded after 0.2 s
    assert metrics.reasons == ["idle"]


async def test_an_unload_waits_for_the_leases_and_their_requests_may_still_submit(nursery):
    alpha = FakeService("alpha")
    residency, metrics = await started(nursery, alpha)
    async with residency.lease(alpha) as serving:
        with pytest.raises(Busy):  # an unload that does not wait refuses while it is held
            await residency.unload(alpha, "request", wait=False)
        unloading = trio.Event()

        async def unload() -> None:
            unloading.set()
            await residency.unload(alpha, "request")

        nursery.start_soon(unload)
        await unloading.wait()
        await wait_until(lambda: alpha.state == "unloading")
        await trio.sleep(0.1)
        # The holder's request may still be submitted: the scheduler takes requests.
        assert not serving.scheduler.draining and alpha.serving is serving
    await wait_until(lambda: alpha.state == "unloaded")
    assert serving.scheduler.draining and metrics.unloads["alpha"] == 1


async def test_an_unload_past_its_drain_timeout_goes_on_without_the_lease(nursery):
    alpha = FakeService("alpha")
    metrics = FakeMetrics()
    quick = dataclasses.replace(rules(), drain_timeout=0.2)
    residency = Residency(lambda: [alpha], quick, metrics)  # type: ignore[arg-type]
    await nursery.start(residency.run)
    serving, lease = await residency.take_lease(alpha)
    with trio.fail_after(120):
        await residency.unload(alpha, "request")
    assert alpha.state == "unloaded" and serving.scheduler.draining
    lease.release()  # given back after the unload: nothing else changes
    assert alpha.leases.held == 0 and alpha.state == "unloaded"
    with trio.fail_after(120):
        again = await residency.acquire(alpha)
    assert again is not serving


async def test_an_encoder_with_a_lease_out_is_not_idle(nursery):
    encoder = FakeEncoder("embedder")
    residency, metrics = await encoder_started(nursery, encoder, models_max=0, idle_unload=0.2)
    await encoder.settled()
    lease = encoder.take_lease()
    assert not encoder.idle
    assert await residency.unload_encoder(encoder, "request") is False  # busy: held
    await trio.sleep(0.5)  # several idle looks, past its idle time
    assert encoder.state == "loaded"
    returned_at = trio.current_time()
    lease.release()
    assert encoder.idle and encoder.last_used >= returned_at
    await wait_until(lambda: encoder.state == "unloaded")
    assert metrics.unloads["embedder"] == 1
