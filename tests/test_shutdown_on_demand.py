"""SIGTERM on a server that loads its models on demand (--models-dir), under `ovtrio
serve` and the hypercorn command alike: embedding requests computing when the signal
comes run to their end within the drain, as generation requests do, and a request
waiting for its model's load hears at once that the server is shutting down (a 503 with
Retry-After), never a connection cut mid-response (ovtrio/serving/shutdown.py).
Nothing here depends on what a model writes.
"""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest
import trio

from conftest import RunningServer
from helpers import assert_error
from ovtrio.embedding.embedded import EMBEDDED_EMBEDDER_NAME
from ovtrio.model import embedded_model_path
from server_pool import server_fixture

# Only keeps a broken server from hanging the test; nothing is timed against it.
HANG_GUARD = 120
# Inputs of each embedding request: a few seconds of work on 2 cores, more than
# Hypercorn's graceful timeout (a drain that missed them would see them cut), far less
# than the drain timeout (30 s).
INPUTS = 256
TEXT = "lorem ipsum dolor sit amet " * 28


def two_models(folder: Path) -> None:
    models = folder / "models"
    models.mkdir()
    for name in ("alpha", "beta"):
        (models / f"{name}.gguf").symlink_to(embedded_model_path())


stop_serve = server_fixture(
    "stop_serve_on_demand", "--models-dir", "{folder}/models", "--num-kv-blocks", "64", prepare=two_models
)
stop_hypercorn = server_fixture(
    "stop_hypercorn_on_demand",
    env={"OVTRIO_MODELS_DIR": "{folder}/models", "OVTRIO_NUM_KV_BLOCKS": "64"},
    hypercorn=True,
    prepare=two_models,
)


async def model_state(http: httpx.AsyncClient, name: str) -> str:
    models = (await http.get("/v1/models")).json()["data"]
    return next(model["status"]["value"] for model in models if model["id"] == name)


def embeddings(count: int) -> dict[str, object]:
    return {"model": EMBEDDED_EMBEDDER_NAME, "input": [TEXT] * count}


@pytest.mark.parametrize("name", ["stop_serve_on_demand", "stop_hypercorn_on_demand"])
async def test_sigterm_drains_embeddings_and_refuses_requests_waiting_for_a_load(server_pool, name):
    server: RunningServer = server_pool.take(name)
    results: dict[str, httpx.Response | str] = {}
    try:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=HANG_GUARD) as http:
            with trio.fail_after(HANG_GUARD):
                warm = await http.post("/v1/embeddings", json=embeddings(1))  # the embedder loads
                assert warm.status_code == 200, warm.text

                async def post(key: str, path: str, body: dict[str, object]) -> None:
                    try:
                        results[key] = await http.post(path, json=body)
                    except httpx.TransportError as exc:  # cut: what the test is about
                        results[key] = f"{type(exc).__name__}: {exc}"

                async with trio.open_nursery() as nursery:
                    for key in ("first", "second"):
                        nursery.start_soon(post, key, "/v1/embeddings", embeddings(INPUTS))
                    chat = {"model": "beta", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 64}
                    nursery.start_soon(post, "chat", "/v1/chat/completions", {**chat, "stream": True})
                    while await model_state(http, "beta") != "loading":
                        await trio.sleep(0.02)
                    await trio.sleep(0.3)  # the embedding requests reach their model
                    server.process.send_signal(signal.SIGTERM)
            exit_code = await trio.to_thread.run_sync(lambda: server.process.wait(timeout=HANG_GUARD))
    finally:
        if server.process.poll() is None:
            server.process.kill()

    log = server.log_path.read_text()
    # The request waiting for beta's load: a 503 that says why, not a stream cut.
    assert isinstance(results["chat"], httpx.Response), results["chat"]
    assert_error(results["chat"], 503, param=None, code="server_shutting_down", type="server_error")
    assert int(results["chat"].headers["Retry-After"]) >= 0
    # The embedding requests in flight ran to their end.
    for key in ("first", "second"):
        reply = results[key]
        assert isinstance(reply, httpx.Response) and reply.status_code == 200, reply
        assert len(reply.json()["data"]) == INPUTS
    assert "draining 2 requests" in log and "drained in" in log, log
    assert exit_code == 0
