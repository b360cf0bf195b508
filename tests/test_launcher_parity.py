"""Both ways of starting the server give the same guarantees. Every other module runs
its servers with `ovtrio serve`; here each guarantee is checked once under the other,
`hypercorn -k trio --config python:ovtrio.server.hypercorn_config ovtrio.app:app`,
configured by OVTRIO_* environment variables alone (conftest.launch_server).

What the hypercorn command does its own way, and so what is checked here: the settings
come from the environment; the app is built in Hypercorn's worker process at its first
lifespan event, and its models load there; the HTTP and WebSocket patches are applied in
that worker; Hypercorn reads the listen backlog and its timeouts from the settings
module; Hypercorn's main process takes the signals, and the drain before the worker
stops listening is a patch (ovtrio/server/hypercorn_patches/drain.py). What the code
both launchers share decides (the registry, the residency of a models folder, the
scheduler, the limits' own rules) is tested under `ovtrio serve`, in its own module;
here only that it holds under this launcher, one compact test per guarantee.

Four servers: conftest's `hypercorn_server` (connections, limits, settings, hostile
requests, seams); guarded_servers' `open_hypercorn` (the Responses WebSocket's limits);
`hypercorn_folder`, a models folder of generation models, encoders and broken files
(models and encoders on demand, hostile files, and last the drain on SIGTERM); and
`hypercorn_text_folder`, a folder of one text model with a 1 s drain (the body limit
following the folder, large image bodies, and last the drain timeout). A test that
stops its server takes it out of the pool, after every other test of that server.
Nothing here depends on what a model writes: requests force their length.
"""

from __future__ import annotations

import re
import shutil
import signal
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import trio
from trio_websocket import open_websocket_url

import loopback
import test_connections as connections
import tiny_vlm
from conftest import HYPERCORN_KEEP_ALIVE, HYPERCORN_MODEL, RunningServer
from guarded_servers import open_hypercorn  # noqa: F401 (fixture)
from helpers import assert_error, beside_innocent_streams, chat_body, completion_body, post
from ovtrio.embedding.embedded import EMBEDDED_EMBEDDER_NAME
from ovtrio.model import embedded_model_path
from server_pool import server_fixture
from sse import parse_sse
from test_body_limit import image_chat, move_in, text_folder
from test_encoders_on_demand import (
    BROKEN_WHISPER,
    CUT_SHORT,
    EMBEDDER,
    NO_TOKENIZER,
    WHISPER,
    cards,
    embed,
    encoders_folder,
    transcribe,
)
from test_hostile_model_files import assert_short_gguf_fails_alone, cut_in_half, tensor_past_the_end
from test_hostile_requests import (
    assert_a_schema_the_engine_cannot_compile_is_a_400,
    assert_special_token_text_counts_as_text,
)
from test_large_image_bodies import lifted_and_parsed_whole_agree
from test_limits import DEFAULT_BODY_BYTES, LONG
from test_models_on_demand import HANG_CAP, KV_BLOCKS, chat, count, loads, states, unload, wait_for_state
from test_seams import HYPERCORN_SEAMS, assert_every_seam_logged_applied
from test_shutdown import (
    FINISHES,
    NEVER_FINISHES,
    SHUTTING_DOWN,
    Traffic,
    assert_new_requests_refused,
    assert_phases,
    assert_stream_and_unary_finished,
    exit_code,
    log_lines,
    response_create,
)
from test_shutdown_on_demand import BATCH, DRAIN, INPUTS, batches, embeddings, model_state
from test_socket_limits import (
    assert_messages_over_the_setting_get_an_error_event,
    closed_once_idle,
    runs_a_response,
    ws_url,
)
from test_startup import gguf_with_architecture

# Only keeps a broken server from hanging a test; nothing is timed against it.
HANG_GUARD = 330

# ---- conftest's hypercorn_server: connections, limits, settings, hostile requests, seams ----


def test_the_settings_come_from_the_environment(hypercorn_server):
    models = loopback.get(hypercorn_server.base_url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == [HYPERCORN_MODEL, "all-MiniLM-L6-v2"]  # and the embedded embedder
    with openai.OpenAI(base_url=hypercorn_server.base_url + "/v3", api_key="unused", max_retries=0) as sdk:
        reply = sdk.chat.completions.create(
            model=HYPERCORN_MODEL,
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=8,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        assert reply.model == HYPERCORN_MODEL
        assert reply.usage.completion_tokens == 8
        with pytest.raises(openai.NotFoundError):
            sdk.chat.completions.create(
                model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": "Hello"}], max_tokens=4
            )


def test_the_limits_are_the_same(hypercorn_server):
    base = hypercorn_server.base_url
    too_big = post(base, "/tokenize", {"prompt": "a" * (DEFAULT_BODY_BYTES + 1000)})
    assert too_big.status_code == 413 and too_big.json()["error"]["code"] == "request_too_large"
    assert_error(post(base, "/tokenize", {"prompt": LONG}), 400, param="prompt", code="context_length_exceeded")
    exposition = loopback.get(base + "/metrics").text
    assert re.search(r"^ovtrio_grammar_cache_bytes ", exposition, re.M)
    assert re.search(r"^ovtrio_response_store_bytes ", exposition, re.M)


def test_connections_that_should_close_do(hypercorn_server):
    """After `Connection: close` and HTTP/1.0 (EOF, no descriptor kept), idle at the
    keep-alive timeout, closed by the client, or hung up on while answered (no
    traceback): test_connections.py says why each."""
    server = hypercorn_server
    port = connections.port_of(server)
    connections.check_closing(port, connections.worker_pid(server.process.pid), rounds=20, model=HYPERCORN_MODEL)
    # The idle timer starts after each response: an idle keep-alive connection is closed
    # by the server after the keep-alive timeout this server was started with.
    with socket.create_connection(("127.0.0.1", port), timeout=connections.HANG_GUARD) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        reply = b""
        while not connections.complete(reply):
            reply += sock.recv(65536)
        assert connections.status(reply) == b"200", reply
        answered = time.monotonic()
        assert sock.recv(65536) == b""  # a socket timeout here means the server kept it open
        # Closed by the idle timer, not by anything sooner.
        assert time.monotonic() - answered >= HYPERCORN_KEEP_ALIVE * 0.9
    connections.assert_connections_closed_by_the_client_are_released_at_once(server)
    connections.assert_clients_hanging_up_leave_no_traceback(server)


def test_requests_that_could_smuggle_or_break_a_connection_are_refused(hypercorn_server):
    connections.assert_a_request_with_an_ambiguous_length_is_refused(hypercorn_server)
    for framing in connections.HANDSHAKE_BODIES.values():
        connections.assert_a_websocket_handshake_with_a_body_is_refused(hypercorn_server, framing)


def test_the_listen_backlog_takes_a_burst_of_connections(hypercorn_server):
    connections.assert_a_burst_of_connections_is_served(hypercorn_server)


def test_running_out_of_descriptors_is_one_log_line(hypercorn_server):
    pid = connections.worker_pid(hypercorn_server.process.pid)
    connections.assert_running_out_of_descriptors_is_one_log_line(hypercorn_server, pid)


def test_what_one_request_pushes_to_the_engine_fails_only_that_request(hypercorn_server):
    assert_a_schema_the_engine_cannot_compile_is_a_400(hypercorn_server, HYPERCORN_MODEL)
    assert_special_token_text_counts_as_text(hypercorn_server, HYPERCORN_MODEL)


def test_every_seam_is_applied_and_the_drain_too(hypercorn_server):
    assert_every_seam_logged_applied(hypercorn_server, HYPERCORN_SEAMS)


# ---- guarded_servers' open_hypercorn: the Responses WebSocket's limits --------------------------


async def test_the_responses_websocket_keeps_its_limits(open_hypercorn):
    """Messages over OVTRIO_WEBSOCKET_MAX_MESSAGE_BYTES get an error event, and a socket
    idle for OVTRIO_WEBSOCKET_IDLE_TIMEOUT is closed (test_socket_limits.py)."""
    await assert_messages_over_the_setting_get_an_error_event(open_hypercorn)
    async with open_websocket_url(ws_url(open_hypercorn)) as ws:
        await runs_a_response(ws)
        await closed_once_idle(ws)


# ---- hypercorn_folder: models and encoders on demand, hostile files, the drain ------------------

ALPHA = "alpha"
BETA = "beta"


def every_kind(folder: Path) -> None:
    """The server's models: alpha.gguf, an embedding model, a Whisper model and three
    broken encoder folders (test_encoders_on_demand.encoders_folder), beta.gguf, and a
    GGUF of an architecture the engine cannot read."""
    encoders_folder(folder)
    models = folder / "models"
    (models / f"{BETA}.gguf").symlink_to(embedded_model_path())
    gguf_with_architecture(models / "broken.gguf", "mamba")


hypercorn_folder = server_fixture(
    "hypercorn_folder",
    env={
        "OVTRIO_MODELS_DIR": "{folder}/models",
        "OVTRIO_NUM_KV_BLOCKS": KV_BLOCKS,
        # Its small KV cache would run two sequences at once; the drain runs three.
        "OVTRIO_MAX_RUNNING_SEQUENCES": "4",
        "OVTRIO_ENCODER_MAX_BATCH": BATCH,
        "OVTRIO_DRAIN_TIMEOUT": DRAIN,
    },
    hypercorn=True,
    prepare=every_kind,
)


def models_of(server: RunningServer) -> Path:
    return server.log_path.parent / "models"


def test_a_models_folder_is_listed_and_each_model_loads_on_its_first_request(hypercorn_folder):
    """As test_models_on_demand.py's first test, and clients leaving midway (a load, a
    stream) end what they asked for without a traceback in Hypercorn's log."""
    server = hypercorn_folder
    logged_before = len(server.log_path.read_bytes())
    listed = states(server)
    assert (listed[ALPHA]["value"], listed[BETA]["value"]) == ("unloaded", "unloaded")
    # A file the engine cannot read is listed as failed, with the reason; asking for it is a 503 naming it.
    assert listed["broken"]["value"] == "failed" and "mamba" in listed["broken"]["reason"]
    refused = chat(server, "broken")
    assert refused.status_code == 503 and "mamba" in refused.json()["error"]["message"]
    assert int(refused.headers["retry-after"]) >= 1
    # The server takes requests with every model unloaded.
    assert loopback.get(server.base_url + "/health/ready", timeout=10).status_code == 200

    # A client that leaves while its model loads: the load goes on, once.
    with pytest.raises(httpx.TimeoutException):
        loopback.post(server.base_url + "/v1/chat/completions", json=chat_body(model=ALPHA, max_tokens=2), timeout=0.3)
    wait_for_state(server, ALPHA, "loaded")
    reply = chat(server, ALPHA)
    assert reply.status_code == 200 and reply.json()["model"] == ALPHA
    assert reply.json()["usage"]["completion_tokens"] == 2
    assert loads(server, ALPHA) == 1
    assert states(server)[BETA]["value"] == "unloaded"
    assert server.metric("ovtrio_model_loaded", model_name=ALPHA) == 1
    assert server.metric("ovtrio_model_loaded", model_name=BETA) == 0

    # A stream left after its first token: its request ends in the engine too.
    body = chat_body(model=ALPHA, max_tokens=2000, ignore_eos=True, stream=True)
    with loopback.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=HANG_CAP) as stream:
        assert stream.status_code == 200
        assert next(line for line in stream.iter_lines() if line.startswith("data: {"))
    deadline = time.monotonic() + HANG_CAP
    while server.metric("ovtrio_requests_running", model_name=ALPHA) > 0:
        assert time.monotonic() < deadline, "the stream left runs on"
        time.sleep(0.05)

    # A file copied in later is served without a restart, and unloaded by hand.
    added = models_of(server) / "delta.gguf"
    added.symlink_to(embedded_model_path())
    try:
        assert states(server)["delta"]["value"] == "unloaded"
        reply = chat(server, "delta")
        assert reply.status_code == 200 and reply.json()["model"] == "delta"
        before = count(server, "ovtrio_model_unloads_total", model_name="delta", reason="request")
        assert unload(server, "delta").json()["success"] is True
        assert states(server)["delta"]["value"] == "unloaded"
        assert server.metric("ovtrio_model_unloads_total", model_name="delta", reason="request") == before + 1
    finally:
        added.unlink()
    logged = server.log_path.read_bytes()[logged_before:].decode(errors="replace")
    assert "Traceback" not in logged, logged


def test_each_encoder_loads_on_its_first_request_and_a_broken_one_fails_alone(hypercorn_folder):
    """As test_encoders_on_demand.py's first tests: each kind served as its kind, the
    folder's embedder standing in for the embedded one, and a broken folder failing its
    own model only, beside streams of a generation model."""
    server = hypercorn_folder
    listed = cards(server)
    kinds = {name: listed[name]["kind"] for name in (EMBEDDER, WHISPER, NO_TOKENIZER, CUT_SHORT, BROKEN_WHISPER)}
    assert kinds == {
        EMBEDDER: "embedding",
        WHISPER: "transcription",
        NO_TOKENIZER: "embedding",
        CUT_SHORT: "embedding",
        BROKEN_WHISPER: "transcription",
    }
    assert EMBEDDED_EMBEDDER_NAME not in listed, "the folder's embedder stands in for the embedded one"
    assert listed[WHISPER]["input_modalities"] == ["audio"]
    assert {name: listed[name]["status"]["value"] for name in (EMBEDDER, WHISPER)} == dict.fromkeys(
        (EMBEDDER, WHISPER), "unloaded"
    )
    vectors = embed(server)
    assert vectors.status_code == 200, vectors.text
    assert vectors.json()["model"] == EMBEDDER and len(vectors.json()["data"][0]["embedding"]) == 384
    assert (states(server)[EMBEDDER]["value"], states(server)[WHISPER]["value"]) == ("loaded", "unloaded")
    heard = transcribe(server)
    assert heard.status_code == 200, heard.text
    assert states(server)[WHISPER]["value"] == "loaded"

    # Found without its tokenizer: failed from the start, with the reason.
    assert states(server)[NO_TOKENIZER]["value"] == "failed"
    assert "openvino_tokenizer.xml" in states(server)[NO_TOKENIZER]["reason"]
    # Weights, or a config, cut short: the load fails, and only the model's own requests
    # hear why, while three streams of alpha and the embedder go on.
    answers: dict[str, httpx.Response] = {}

    def hostile() -> None:
        answers["weights"] = embed(server, CUT_SHORT)
        answers["config"] = transcribe(server, BROKEN_WHISPER)
        answers["embedder"] = embed(server)

    beside_innocent_streams(server, hostile, model=ALPHA)
    assert answers["weights"].status_code == 503, answers["weights"].text
    error = answers["weights"].json()["error"]
    assert error["code"] == "model_unavailable" and "weights" in error["message"], error
    assert answers["config"].status_code == 503 and "json" in answers["config"].json()["error"]["message"]
    assert answers["embedder"].status_code == 200, answers["embedder"].text
    listed = states(server)
    assert listed[CUT_SHORT]["value"] == "failed" and "weights" in listed[CUT_SHORT]["reason"]
    assert listed[BROKEN_WHISPER]["value"] == "failed" and "json" in listed[BROKEN_WHISPER]["reason"]
    assert transcribe(server).status_code == 200


def test_a_gguf_shorter_than_its_header_says_fails_alone(hypercorn_folder):
    """The files that crashed the server (test_hostile_model_files.py)."""
    for damage in (cut_in_half, tensor_past_the_end):
        assert_short_gguf_fails_alone(hypercorn_folder, damage, innocent=ALPHA)


async def test_sigterm_drains_what_runs_and_refuses_what_waits_for_a_load(hypercorn_folder, server_pool):
    """As test_shutdown.py's first test and test_shutdown_on_demand.py's together: what
    runs when Hypercorn is told to stop (a stream, a unary request and a WebSocket
    response of alpha, and a long embedding request) runs to its end while the worker
    still listens, and refuses new work with a 503 that says why; a request waiting for
    beta's load hears it at once."""
    server: RunningServer = server_pool.take("hypercorn_folder")
    results: dict[str, httpx.Response | str] = {}
    try:
        # A new connection for each request: one kept alive by a server whose event loop
        # is busy a moment may be closed by its keep-alive timeout as a request comes.
        fresh = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=HANG_GUARD, limits=fresh) as http:
            with trio.fail_after(HANG_GUARD):
                assert (await http.post("/models/unload", json={"model": BETA})).status_code == 200
                warm = await http.post("/v1/chat/completions", json=chat_body(model=ALPHA, max_tokens=1))
                assert warm.status_code == 200, warm.text
                warm = await http.post("/v1/embeddings", json=embeddings(1, EMBEDDER))
                assert warm.status_code == 200, warm.text

                async def post_keeping(key: str, path: str, body: dict[str, Any]) -> None:
                    try:
                        results[key] = await http.post(path, json=body)
                    except httpx.TransportError as exc:  # cut: what the test is about
                        results[key] = f"{type(exc).__name__}: {exc}"

                async with trio.open_nursery() as nursery:
                    before = await batches(http, EMBEDDER)
                    nursery.start_soon(post_keeping, "embeddings", "/v1/embeddings", embeddings(INPUTS, EMBEDDER))
                    while await batches(http, EMBEDDER) == before:  # its first part is computed: it runs
                        await trio.sleep(0.02)
                    traffic = Traffic(server, http, nursery, model=ALPHA)
                    traffic.stream(
                        "chat",
                        "/v1/chat/completions",
                        chat_body(model=ALPHA, max_tokens=FINISHES, ignore_eos=True, stream=True),
                    )
                    traffic.unary(
                        "unary", "/v1/completions", completion_body(model=ALPHA, max_tokens=FINISHES, ignore_eos=True)
                    )
                    send_frame = traffic.socket("socket", FINISHES)
                    await traffic.all_running()
                    waiting = chat_body(model=BETA, max_tokens=64, stream=True)
                    nursery.start_soon(post_keeping, "waiting", "/v1/chat/completions", waiting)
                    while await model_state(http, BETA) != "loading":
                        await trio.sleep(0.02)
                    signalled = len(log_lines(server))
                    server.process.send_signal(signal.SIGTERM)

                    # As soon as Hypercorn's worker hears of it: not ready, still alive,
                    # new work refused with a reason.
                    ready = await http.get("/health/ready")
                    while ready.status_code == 200:  # the signal is on its way
                        await trio.sleep(0.01)
                        ready = await http.get("/health/ready")
                    # (The server's status is the first of failed, draining and loading
                    # that applies, and the folder holds models that failed.)
                    assert ready.status_code == 503, ready.text
                    assert {model["id"]: model["status"] for model in ready.json()["models"]}[ALPHA] == "draining"
                    await send_frame(response_create(2, ALPHA, stream_id="late"))
                    assert (await http.get("/health")).status_code == 200
                    await assert_new_requests_refused(http, ALPHA)
            assert await exit_code(server.process) == 0
    finally:
        if server.process.poll() is None:
            server.process.kill()

    # The requests in flight ended normally, every token and vector they asked for written.
    assert_stream_and_unary_finished(traffic)
    embedded = results["embeddings"]
    assert isinstance(embedded, httpx.Response) and embedded.status_code == 200, embedded
    assert len(embedded.json()["data"]) == INPUTS
    # The socket: its response ran to its end, a late one was refused, and once the
    # drain was over the server said why it closed the socket, then closed it.
    events = traffic.results["socket"]
    assert events[-1] == 1001  # going away
    *response_events, closing = events[:-1]
    assert closing["type"] == "error" and closing["code"] == SHUTTING_DOWN and "stream_id" not in closing
    refusals = [e for e in response_events if e.get("stream_id") == "late"]
    assert [(e["type"], e["code"]) for e in refusals] == [("error", SHUTTING_DOWN)]
    finals = [e for e in response_events if e["type"].startswith("response.") and "response" in e]
    assert finals[-1]["type"] == "response.incomplete"
    assert finals[-1]["response"]["usage"]["output_tokens"] == FINISHES
    # The request waiting for beta's load: a 503 that says why, not a stream cut.
    refused = results["waiting"]
    assert isinstance(refused, httpx.Response), refused
    assert_error(refused, 503, param=None, code=SHUTTING_DOWN, type="server_error")
    assert int(refused.headers["Retry-After"]) >= 0
    assert_phases(server, "hypercorn", 4, "drained in", since=signalled)


# ---- hypercorn_text_folder: the body limit follows the folder; the drain timeout ---------------

# The text limit, set by the environment (the default is 2 MiB).
TEXT_LIMIT = 1_000_000

hypercorn_text_folder = server_fixture(
    "hypercorn_text_folder",
    env={
        "OVTRIO_MODELS_DIR": "{folder}/models",
        "OVTRIO_MAX_BODY_BYTES": str(TEXT_LIMIT),
        "OVTRIO_EMBEDDINGS": "false",
        "OVTRIO_DRAIN_TIMEOUT": "1",
        # Without the prefix cache two runs of one request compare token for token
        # (conftest.EXACT_REPEATS says why).
        "OVTRIO_ENABLE_PREFIX_CACHING": "false",
    },
    hypercorn=True,
    prepare=text_folder,
)


def test_the_body_limit_follows_the_folder_and_large_image_bodies_read_as_a_whole_parse(
    hypercorn_text_folder, tmp_path
):
    """As test_body_limit.py's vision test and test_large_image_bodies.py's first: a
    vision model moved into the folder takes its large bodies on its first request,
    whose data URLs lifted out give the model what a whole parse does; unloaded and
    gone, the limit falls back to the one OVTRIO_MAX_BODY_BYTES sets, and a body over
    it is refused each time it comes."""
    server = hypercorn_text_folder
    folder = move_in(server, "vlm", tiny_vlm.build, tmp_path)
    body = image_chat("vlm")
    # No listing first: the body over the limit has the folder read before it is refused.
    reply = post(server.base_url, "/v1/chat/completions", body)
    assert len(reply.request.content) > 3 * TEXT_LIMIT
    assert reply.status_code == 200, reply.text[:500]
    assert reply.json()["usage"]["prompt_tokens"] >= tiny_vlm.IMAGE_TOKENS
    lifted_and_parsed_whole_agree(server.base_url)
    assert unload(server, "vlm").status_code == 200
    shutil.rmtree(folder)
    assert "vlm" not in {card["id"] for card in loopback.get(server.v1 + "/models", timeout=30).json()["data"]}
    oversized = {"model": ALPHA, "prompt": "a" * (TEXT_LIMIT + 1_000_000)}
    for path, refused_body in (("/v1/chat/completions", body), *[("/v1/completions", oversized)] * 3):
        refused = post(server.base_url, path, refused_body)
        assert refused.status_code == 413, refused.text[:500]
        assert refused.json()["error"]["code"] == "request_too_large"
        assert f"than the {TEXT_LIMIT} bytes" in refused.json()["error"]["message"]


async def test_requests_still_running_at_the_drain_timeout_end_with_an_error(hypercorn_text_folder, server_pool):
    """As test_shutdown.py's second test: OVTRIO_DRAIN_TIMEOUT bounds the drain (a second
    signal cannot cut it short under Hypercorn), and what still runs then ends with an
    error the client reads, before Hypercorn closes the connections."""
    server: RunningServer = server_pool.take("hypercorn_text_folder")
    try:
        fresh = httpx.Limits(max_keepalive_connections=0)  # as in the test above
        async with httpx.AsyncClient(base_url=server.base_url, timeout=HANG_GUARD, limits=fresh) as http:
            with trio.fail_after(HANG_GUARD):
                warm = await http.post("/v1/chat/completions", json=chat_body(model=ALPHA, max_tokens=1))
                assert warm.status_code == 200, warm.text
                async with trio.open_nursery() as nursery:
                    traffic = Traffic(server, http, nursery, model=ALPHA)
                    traffic.stream(
                        "chat",
                        "/v1/chat/completions",
                        chat_body(model=ALPHA, max_tokens=NEVER_FINISHES, ignore_eos=True, stream=True),
                    )
                    traffic.unary(
                        "unary",
                        "/v1/chat/completions",
                        chat_body(model=ALPHA, max_tokens=NEVER_FINISHES, ignore_eos=True),
                    )
                    traffic.socket("socket", NEVER_FINISHES)
                    await traffic.all_running()
                    signalled = len(log_lines(server))
                    server.process.send_signal(signal.SIGTERM)
            assert await exit_code(server.process) == 0
    finally:
        if server.process.poll() is None:
            server.process.kill()

    # Chat: an error chunk, then [DONE] (parse_sse checks the [DONE]).
    chunks = parse_sse(traffic.results["chat"])
    assert chunks[-1]["error"]["code"] == SHUTTING_DOWN
    assert all("error" not in chunk for chunk in chunks[:-1])
    # Unary: an error body in OpenAI's shape, retryable.
    unary = traffic.results["unary"]
    assert_error(unary, 503, param=None, code=SHUTTING_DOWN, type="server_error")
    assert "Retry-After" in unary.headers
    # WebSocket: the response fails, then the socket's error event, then the close.
    socket_events = traffic.results["socket"]
    assert socket_events[-1] == 1001
    assert socket_events[-3]["type"] == "response.failed"
    assert socket_events[-2]["type"] == "error" and socket_events[-2]["code"] == SHUTTING_DOWN
    assert_phases(server, "hypercorn", 3, "drain timed out after", since=signalled)
    assert any("cut 3 requests" in line for line in log_lines(server)[signalled:])
    assert "Traceback" not in server.log_path.read_text(errors="replace")
