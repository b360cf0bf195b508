"""A request the KV cache can never hold is refused before the engine sees it (the engine
would otherwise drop it, and possibly others, halfway); the requests around it finish."""

from __future__ import annotations

import httpx
import trio

import loopback
from conftest import MODEL
from openai_schema import validate
from server_pool import server_fixture

# 4 blocks of 32 tokens: room for two short requests, never for a 700-token prompt.
KV_BLOCKS = "4"
KV_TOKENS = int(KV_BLOCKS) * 32


small_cache_server = server_fixture("small_cache_server", "--num-kv-blocks", KV_BLOCKS)


async def test_request_too_big_for_the_kv_cache_fails_alone(small_cache_server):
    base = small_cache_server.base_url
    results: dict[str, httpx.Response] = {}

    async def post(name: str, body: dict) -> None:
        async with httpx.AsyncClient(base_url=base, timeout=120) as http:
            results[name] = await http.post("/v3/completions", json=body)

    small = {"model": MODEL, "prompt": "Count: one, two,", "max_tokens": 20, "ignore_eos": True, "temperature": 0}
    huge = {"model": MODEL, "prompt": "hello " * 700, "max_tokens": 10}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(post, "small-1", small)
        nursery.start_soon(post, "huge", huge)
        nursery.start_soon(post, "small-2", small)

    refused = results["huge"]
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
    assert "KV cache" in error["message"] and f"{KV_TOKENS} tokens" in error["message"]
    assert set(error) == {"message", "type", "param", "code"}
    for name in ("small-1", "small-2"):
        reply = results[name]
        assert reply.status_code == 200, reply.text
        validate(reply.json(), "CreateCompletionResponse")
        assert reply.json()["usage"]["completion_tokens"] == 20

    # The server goes on serving, and the engine holds nothing.
    after = loopback.post(base + "/v3/completions", json=small, timeout=60)
    assert after.status_code == 200
    assert small_cache_server.metric("ovtrio_requests_running") == 0


def test_default_max_tokens_fits_the_kv_cache(small_cache_server):
    """Without max_tokens a request may run to the end of what the cache holds, not to
    the model's 8192-token context."""
    body = {"model": MODEL, "prompt": "Count: one, two,", "ignore_eos": True, "temperature": 0}
    reply = loopback.post(small_cache_server.base_url + "/v3/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    usage = reply.json()["usage"]
    assert usage["total_tokens"] == KV_TOKENS
    assert reply.json()["choices"][0]["finish_reason"] == "length"


def test_max_tokens_beyond_the_kv_cache_is_refused(small_cache_server):
    body = {"model": MODEL, "prompt": "Count:", "max_tokens": 1000}
    reply = loopback.post(small_cache_server.base_url + "/v3/completions", json=body, timeout=60)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "max_tokens"
