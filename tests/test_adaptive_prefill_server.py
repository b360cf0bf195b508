"""The adaptive prefill in a real server (ovtrio/scheduler/prefill_policy.py), read from
its own metrics: a long prompt alone goes in slices of the engine's whole step budget,
far fewer steps than the 256-token steps of ovtrio's earlier releases would take; beside
decoding streams its slices shrink to what the bound on their inter-token gap allows."""

from __future__ import annotations

import httpx
import pytest
import trio

from conftest import MODEL
from helpers import metric_value
from server_pool import server_fixture

pytestmark = pytest.mark.slow

# The prefix cache the slices build on (test servers run without it), and a bound no
# step can keep: beside decoding streams every step takes one KV block of a prompt.
prefill_server = server_fixture("prefill_server", "--enable-prefix-caching", "--max-itl-ms", "1")

EARLIER_STEP_TOKENS = 256
BLOCK_TOKENS = 32


def long_prompt(words: int, first: str) -> str:
    # A different first word each time, so no part of the prompt is in the prefix cache.
    return f"{first} " + "word " * words


async def counters(http: httpx.AsyncClient) -> dict[str, float]:
    text = (await http.get("/metrics")).text
    names = ("engine_steps", "prefill_slices", "prefill_slice_tokens")
    return {name: metric_value(text, f"ovtrio_{name}_total") for name in names}


async def prefilled(http: httpx.AsyncClient, prompt: str) -> tuple[int, dict[str, float]]:
    """Send `prompt` for one token; its prompt tokens and what the counters moved by."""
    before = await counters(http)
    reply = await http.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1})
    assert reply.status_code == 200, reply.text
    after = await counters(http)
    return reply.json()["usage"]["prompt_tokens"], {name: after[name] - before[name] for name in after}


async def test_a_long_prompt_alone_takes_few_large_steps_and_small_ones_beside_decoding(prefill_server):
    async with httpx.AsyncClient(base_url=prefill_server.base_url, timeout=600) as http:
        tokens, alone = await prefilled(http, long_prompt(4500, "alone"))
        assert tokens > 2 * 2048  # at least three slices
        # The whole prompt went in as slices, each far larger than a 256-token step.
        assert alone["prefill_slice_tokens"] == tokens
        assert alone["prefill_slice_tokens"] / alone["prefill_slices"] > EARLIER_STEP_TOKENS
        assert alone["engine_steps"] < tokens / EARLIER_STEP_TOKENS

        streamed = [0] * 4
        ended = [False] * 4
        decoding = trio.Event()

        async def decoder(index: int) -> None:
            body = {"model": MODEL, "prompt": f"{index} Once", "max_tokens": 400, "ignore_eos": True, "stream": True}
            async with http.stream("POST", "/v1/completions", json=body) as reply:
                assert reply.status_code == 200
                async for line in reply.aiter_lines():
                    if line.startswith("data: {"):
                        streamed[index] += 1
                        if min(streamed) >= 3:
                            decoding.set()
            ended[index] = True

        result: dict[str, object] = {}

        async def long_request() -> None:
            await decoding.wait()
            result["tokens"], result["moved"] = await prefilled(http, long_prompt(1000, "beside"))
            result["ended"] = list(ended)

        async with trio.open_nursery() as nursery:
            for index in range(4):
                nursery.start_soon(decoder, index)
            nursery.start_soon(long_request)
        beside = result["moved"]
        assert isinstance(beside, dict) and isinstance(result["tokens"], int)
        assert result["ended"] == [False] * 4  # the streams decoded throughout the prefill
        assert beside["prefill_slice_tokens"] == result["tokens"]
        mean_beside = beside["prefill_slice_tokens"] / beside["prefill_slices"]
        mean_alone = alone["prefill_slice_tokens"] / alone["prefill_slices"]
        # At most the first, unmeasured step's 256 tokens, then a block a step.
        assert mean_beside <= EARLIER_STEP_TOKENS < mean_alone
        assert beside["prefill_slices"] > result["tokens"] / EARLIER_STEP_TOKENS
