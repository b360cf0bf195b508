"""Many requests at once, and clients that leave mid-stream.

Runs the async SDK and httpx.AsyncClient under trio (pytest-trio's trio_mode).
"""

from __future__ import annotations

import time
from contextlib import ExitStack

import httpx
import trio

from helpers import chat, chat_body, metric_value
from sse import MODEL, StreamResult, check_chat_stream

PROMPTS = ["Tell me a short story about a cat.", "What is the capital of France?"]
CONCURRENT = 16
# Long enough (about 32 engine steps) that all the streams, started together, overlap
# in the scheduler even on a slow or busy machine.
TOKENS = 32


async def test_concurrent_streams_all_complete(async_client, server):
    results: dict[int, StreamResult] = {}
    peak_running = 0
    finished = trio.Event()

    async def one(i: int) -> None:
        stream = await async_client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            max_tokens=TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        chunks = [chunk.model_dump(exclude_unset=True) async for chunk in stream]
        results[i] = check_chat_stream(chunks, include_usage=True)

    async def watch_metrics() -> None:
        nonlocal peak_running
        async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as http:
            while not finished.is_set():
                text = (await http.get("/metrics")).text
                peak_running = max(peak_running, int(metric_value(text, "ovtrio_requests_running")))
                await trio.sleep(0.1)  # each scrape costs the server and this process some CPU

    with trio.fail_after(120):
        async with trio.open_nursery() as outer:
            outer.start_soon(watch_metrics)
            async with trio.open_nursery() as requests:
                for i in range(CONCURRENT):
                    requests.start_soon(one, i)
            finished.set()

    assert sorted(results) == list(range(CONCURRENT))
    for result in results.values():
        assert result.finish_reason == "length"
        assert result.usage["completion_tokens"] == TOKENS
    # They really ran side by side in the scheduler.
    assert peak_running >= CONCURRENT // 2, peak_running


def wait_for_metric(server, name: str, value: float, within: float) -> None:
    deadline = time.monotonic() + within
    while (current := server.metric(name)) != value:
        assert time.monotonic() < deadline, f"{name} is {current}, not {value}, after {within} s"
        time.sleep(0.05)


def test_disconnect_cancels_engine_requests(server):
    """Clients that close their connection mid-stream must not leave work behind: each
    of these requests asks for 4000 tokens (about a minute of engine time together)."""
    streams, max_tokens = 4, 4000
    body = chat_body(PROMPTS[0], max_tokens=max_tokens, ignore_eos=True, stream=True)
    tokens_before = server.metric("ovtrio_generated_tokens_total")
    with ExitStack() as stack:
        readers = []
        for _ in range(streams):
            http = stack.enter_context(httpx.Client(base_url=server.base_url, timeout=30))
            response = stack.enter_context(http.stream("POST", "/v3/chat/completions", json=body))
            assert response.status_code == 200
            readers.append(response.iter_lines())
        for lines in readers:
            events = 0
            for line in lines:
                if line.startswith("data: "):
                    assert line != "data: [DONE]"
                    events += 1
                    if events == 3:
                        break
            assert events == 3
        # The gauges do see the requests while they run...
        assert server.metric("ovtrio_requests_running") == streams
        assert server.metric("ovtrio_engine_requests") == streams
    # ...and the engine drops them once their clients are gone.
    wait_for_metric(server, "ovtrio_requests_running", 0, within=5)
    wait_for_metric(server, "ovtrio_engine_requests", 0, within=5)
    settled = server.metric("ovtrio_generated_tokens_total")
    time.sleep(1)
    assert server.metric("ovtrio_generated_tokens_total") == settled, "tokens are still being generated"
    assert settled - tokens_before < streams * max_tokens / 4


def test_server_serves_normally_after_disconnects(server):
    result = chat(server.base_url, content=PROMPTS[1], max_tokens=8, temperature=0, ignore_eos=True)
    assert result.usage["completion_tokens"] == 8
    # The engine lets a finished request go in the step after its last token, which can
    # run after the response went out: nothing is left behind once it has.
    wait_for_metric(server, "ovtrio_engine_requests", 0, within=5)
    assert server.metric("ovtrio_requests_running") == 0
