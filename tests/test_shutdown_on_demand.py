"""SIGTERM on a server that loads its models on demand (--models-dir): an embedding
request computing when the signal comes runs to its end within the drain, as generation
requests do, and a request waiting for its model's load hears at once that the server is
shutting down (a 503 with Retry-After), never a connection cut mid-response
(ovtrio/serving/shutdown.py). The same under the hypercorn command:
test_launcher_parity.py. Nothing here depends on what a model writes.
"""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import trio

from conftest import RunningServer, sample_value
from helpers import assert_error
from ovtrio.embedding.embedded import EMBEDDED_EMBEDDER_NAME
from ovtrio.model import embedded_model_path
from server_pool import server_fixture

# Only keeps a broken server from hanging the test; nothing is timed against it.
HANG_GUARD = 330
# The embedding request: computed BATCH inputs at a time, several seconds of work on 2
# cores, more than Hypercorn's graceful timeout (a drain that missed it would see it
# cut). The drain may take up to DRAIN seconds: the servers the other tests start at the
# same time can slow it down many times.
INPUTS = 256
BATCH = "8"
DRAIN = "300"
TEXT = "lorem ipsum dolor sit amet " * 28


def two_models(folder: Path) -> None:
    models = folder / "models"
    models.mkdir()
    for name in ("alpha", "beta"):
        (models / f"{name}.gguf").symlink_to(embedded_model_path())


stop_serve = server_fixture(
    "stop_serve_on_demand",
    "--models-dir",
    "{folder}/models",
    "--num-kv-blocks",
    "64",
    "--encoder-max-batch",
    BATCH,
    "--drain-timeout",
    DRAIN,
    prepare=two_models,
)


async def model_state(http: httpx.AsyncClient, name: str) -> str:
    models = (await http.get("/v1/models")).json()["data"]
    return next(model["status"]["value"] for model in models if model["id"] == name)


def embeddings(count: int, model: str = EMBEDDED_EMBEDDER_NAME) -> dict[str, object]:
    return {"model": model, "input": [TEXT] * count}


async def batches(http: httpx.AsyncClient, model: str = EMBEDDED_EMBEDDER_NAME) -> float:
    """The batches the embedding model has computed."""
    text = (await http.get("/metrics")).text
    return sample_value(text, "ovtrio_encoder_batch_size_count", model_name=model)


async def test_sigterm_drains_embeddings_and_refuses_a_request_waiting_for_a_load(server_pool):
    server: RunningServer = server_pool.take("stop_serve_on_demand")
    results: dict[str, httpx.Response | str] = {}
    try:
        # A new connection for each request: one kept alive by a server whose event loop
        # is busy a moment may be closed by its keep-alive timeout as a request comes.
        fresh = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=HANG_GUARD, limits=fresh) as http:
            with trio.fail_after(HANG_GUARD):
                warm = await http.post("/v1/embeddings", json=embeddings(1))  # the embedder loads
                assert warm.status_code == 200, warm.text

                async def post(key: str, path: str, body: dict[str, object]) -> None:
                    try:
                        results[key] = await http.post(path, json=body)
                    except httpx.TransportError as exc:  # cut: what the test is about
                        results[key] = f"{type(exc).__name__}: {exc}"

                async with trio.open_nursery() as nursery:
                    before = await batches(http)
                    nursery.start_soon(post, "embeddings", "/v1/embeddings", embeddings(INPUTS))
                    while await batches(http) == before:  # its first part is computed: it runs
                        await trio.sleep(0.02)
                    chat = {"model": "beta", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 64}
                    nursery.start_soon(post, "chat", "/v1/chat/completions", {**chat, "stream": True})
                    while await model_state(http, "beta") != "loading":
                        await trio.sleep(0.02)
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
    # The embedding request in flight ran to its end.
    reply = results["embeddings"]
    assert isinstance(reply, httpx.Response) and reply.status_code == 200, log
    assert len(reply.json()["data"]) == INPUTS
    assert "draining 1 requests" in log and "drained in" in log, log
    assert exit_code == 0
