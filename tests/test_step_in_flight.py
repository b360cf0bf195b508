"""The server answers while the engine computes.

Proof without a clock: two /metrics scrapes that both see the engine inside a step, and
the same count of steps entered, bracket one engine step; a /health answered between
them was answered during that step. With a step that holds the GIL no scrape can ever
see the engine inside a step, so this holds only for the GIL-free step.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice

import httpx
import pytest
import trio

from conftest import HYPERCORN_MODEL, MODEL
from helpers import chat, metric_value
from test_concurrency import wait_for_metric

# About 1,800 tokens: a step of a second or more (the test servers run without the prefix cache,
# so the engine prefills it in steps of --max-num-batched-tokens).
LONG_PROMPT = "word " * 1800
ATTEMPTS = 8


@dataclass(frozen=True)
class Scrape:
    steps_started: float
    in_flight: bool


async def scrape(http: httpx.AsyncClient) -> Scrape:
    text = (await http.get("/metrics")).text
    return Scrape(
        metric_value(text, "ovtrio_engine_steps_started_total"),
        metric_value(text, "ovtrio_engine_step_in_flight") == 1,
    )


async def health_during_one_step(http: httpx.AsyncClient, attempt: int) -> bool:
    """Run one long prefill and probe until /health lands inside one of its steps."""
    finished = trio.Event()
    proven = False

    async def long_request() -> None:
        # A different first word each time, so no part of the prompt is in the prefix cache.
        body = {"model": MODEL, "prompt": f"{attempt} {LONG_PROMPT}", "max_tokens": 1}
        reply = await http.post("/v3/completions", json=body)
        assert reply.status_code == 200, reply.text
        finished.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(long_request)
        while not finished.is_set() and not proven:
            before = await scrape(http)
            health = await http.get("/health")
            after = await scrape(http)
            assert health.status_code == 200 and health.json() == {"status": "ok"}
            proven = before.in_flight and after.in_flight and before.steps_started == after.steps_started
    return proven


async def test_health_is_answered_while_an_engine_step_runs(server):
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
        assert metric_value((await http.get("/metrics")).text, "ovtrio_engine_step_releases_gil") == 1
        for attempt in range(ATTEMPTS):
            if await health_during_one_step(http, attempt):
                return
    pytest.fail(f"no /health answer fell inside an engine step in {ATTEMPTS} long prefills")


def test_the_setting_forces_the_bindings_step(alternate_server):
    server = alternate_server
    assert server.metric("ovtrio_engine_step_releases_gil") == 0
    assert "GIL-free stepping is turned off" in server.log_path.read_text()
    result = chat(server.base_url, content="Hi", max_tokens=8, temperature=0, ignore_eos=True)
    assert result.usage["completion_tokens"] == 8
    assert server.metric("ovtrio_engine_steps_total") > 0
    assert server.metric("ovtrio_engine_requests") == 0


def test_a_client_leaving_frees_the_engine_with_the_bindings_step(alternate_server):
    server = alternate_server
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count to a thousand."}],
        "max_tokens": 4000,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        with http.stream("POST", "/v3/chat/completions", json=body) as response:
            assert response.status_code == 200
            lines = response.iter_lines()  # kept open: closing it would close the response
            events = list(islice((line for line in lines if line.startswith("data: ")), 3))
            assert len(events) == 3
            assert server.metric("ovtrio_requests_running") == 1
            assert server.metric("ovtrio_engine_requests") == 1
    # Within a cap that bounds a hang only: the server sees the client gone at its next write.
    wait_for_metric(server, "ovtrio_requests_running", 0, within=120)
    wait_for_metric(server, "ovtrio_engine_requests", 0, within=120)


# Token ids of ordinary words (the embedded vocabulary has 49,152): a prompt of more than
# two of the slices a prompt alone is prefilled in (the engine's step budget, 2,048 tokens:
# ovtrio/scheduler/prefill_policy.py), starting with an id no other test's prompt starts
# with, so that nothing of it is in the prefix cache.
LONG_PROMPT_IDS = [7777] + [1000 + (i * 37) % 20000 for i in range(1, 5000)]


async def test_a_short_request_is_answered_while_a_long_prompt_is_prefilled(hypercorn_server):
    """The long prompt is prefilled in slices (ovtrio/scheduler/prefill.py), and the short
    request, added between two of them, is answered before the long one ends (one that
    arrives during a slice waits for that slice's step). Without
    slices the engine gives every step's budget to the long prompt until it is done, and
    the short one could only end with it. (The slices build on the prefix cache, which
    this server has on, as servers do by default.)"""
    async with httpx.AsyncClient(base_url=hypercorn_server.base_url, timeout=120) as http:
        prompt = LONG_PROMPT_IDS
        done: list[str] = []

        async def long_request() -> None:
            body = {"model": HYPERCORN_MODEL, "prompt": prompt, "max_tokens": 1}
            reply = await http.post("/v3/completions", json=body)
            assert reply.status_code == 200, reply.text
            assert reply.json()["usage"]["prompt_tokens"] == len(prompt)  # the slices are not counted
            done.append("long")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(long_request)
            with trio.fail_after(120):
                while not done and metric_value((await http.get("/metrics")).text, "ovtrio_requests_running") < 1:
                    await trio.sleep(0.005)
            reply = await http.post("/v3/completions", json={"model": HYPERCORN_MODEL, "prompt": "Hi", "max_tokens": 1})
            assert reply.status_code == 200, reply.text
            done.append("short")
        assert done == ["short", "long"]
