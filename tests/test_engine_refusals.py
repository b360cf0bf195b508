"""Whatever the engine's binding raises while a request is added fails that request
alone: RuntimeError for what its checks refuse, and the others the binding lets through
(IndexError from a std::stoul in a vision-language prompt, ValueError, TypeError,
OverflowError, ...). The loop keeps serving; and a loop that fails anyway marks its model
failed, which readiness and liveness report. Pure logic against the fake pipeline
(fake_engine.py); tests/test_vlm_text.py shows the same on the real engine."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import trio
import trio.lowlevel

from fake_engine import received, request, start_scheduler
from ovtrio.scheduler import Completed, GenerationRequest, SamplingParams, UnsupportedParams
from ovtrio.scheduler.params import TextPrompt
from ovtrio.serving.registry import ModelRegistry
from ovtrio.settings.server import Settings

ERRORS = [IndexError("stoul"), ValueError("bad value"), TypeError("bad type"), OverflowError("too big"), KeyError("k")]


def image_request() -> GenerationRequest:
    image = np.zeros((4, 4, 3), dtype=np.uint8)
    text = TextPrompt("<ov_genai_image_0> what is this?", (image,))
    return GenerationRequest([[1, 1, 1]], SamplingParams(max_new_tokens=2, temperature=0.0), [text])


@pytest.fixture(params=[False, True], ids=["binding-step", "gil-free-runs"])
async def engine(nursery, request):
    return await start_scheduler(nursery, gil_free=request.param)


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("kind", ["token-ids", "text-and-images"])
async def test_any_exception_of_an_add_fails_that_request_alone(engine, error, kind):
    make = (lambda: request(3)) if kind == "token-ids" else image_request
    results: list[list] = []

    async def innocent() -> None:
        results.append(await received(engine.scheduler, request(3)))

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(innocent)
        await trio.sleep(0.01)
        engine.pipeline.add_errors.append(error)
        with pytest.raises(UnsupportedParams) as refused:
            await received(engine.scheduler, make())
    assert str(refused.value).startswith(f"{type(error).__name__}: "), str(refused.value)
    assert [r[-1] for r in results] == [Completed(prompt_tokens=1, completion_tokens=3)] * 3
    after = await received(engine.scheduler, make())
    assert isinstance(after[-1], Completed)
    assert engine.scheduler.stats().running == 0


class BrokenScheduler:
    """A scheduler whose loop fails once it has started serving."""

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.lowlevel.checkpoint()
        raise RuntimeError("the loop broke\nwith a second line")


async def test_a_scheduler_that_dies_marks_its_model_failed_for_readiness_and_liveness():
    registry = ModelRegistry([Settings()], drain_timeout=1)
    service = registry.services[0]
    service.source = SimpleNamespace(name="m", path=Path("m"))  # type: ignore[assignment]
    service.ready.set()  # it was serving
    assert registry.status(service) == "ready"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(registry._watch_failures)
        with trio.fail_after(5):
            await nursery.start(service._run_scheduler, BrokenScheduler())
            await registry.failed.wait()  # every model failed: /health answers 503
    assert registry.status(service) == "failed"  # /health/ready: 503, "failed"
    assert service.failure == "its scheduler stopped after an internal error (RuntimeError: the loop broke)"


async def test_readiness_liveness_and_requests_report_a_model_whose_scheduler_died(monkeypatch):
    """The HTTP side of it, in process: the app's routes over a registry whose one
    model was serving when its scheduler died (nothing is loaded; the routes only read
    the registry)."""
    from ovtrio.api.context import registry_of
    from ovtrio.server.app import create_app

    # The app sets up the server's log on the "ovtrio" logger (its own handler, no
    # propagation); put it back afterwards, so later tests still capture its records.
    logger = logging.getLogger("ovtrio")
    for name in ("handlers", "propagate", "level"):
        monkeypatch.setattr(logger, name, list(logger.handlers) if name == "handlers" else getattr(logger, name))
    app = create_app(Settings())
    registry = registry_of(app)
    registry.check()  # resolves the embedded model's path and name, loads nothing
    service = registry.services[0]
    service.ready.set()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(registry._watch_failures)
        with trio.fail_after(5):
            await nursery.start(service._run_scheduler, BrokenScheduler())
            await registry.failed.wait()
    client = app.test_client()
    ready = await client.get("/health/ready")
    assert ready.status_code == 503
    body = await ready.get_json()
    assert body["status"] == "failed" and "scheduler stopped" in body["reason"]
    assert (await client.get("/health")).status_code == 503
    reply = await client.post(
        "/v1/chat/completions", json={"model": service.model_name, "messages": [{"role": "user", "content": "hi"}]}
    )
    assert reply.status_code == 503
    error = (await reply.get_json())["error"]
    assert error["code"] == "model_unavailable"
    assert (
        "is unavailable: its scheduler stopped after an internal error (RuntimeError: the loop broke)"
        in error["message"]
    )
