"""Models on demand (--models-dir, ovtrio/serving/residency.py) with the real engine:
a folder of three models (the embedded GGUF linked under three names) and --models-max
2. A model loads from the folder on its first request, the least recently used idle
real model makes room, memory comes back after unloads (twenty cycles, a model loaded at
start under both launchers, a socket left open), an unloaded model's grammar compiler is
no longer read, and SIGTERM drains the loaded models and loads no other. The residency's
rules themselves (shared loads, waits for room, unloads while loading or draining,
leases, keep-alive, what /v1/models and /metrics say) run in process over the fake
engine: test_residency_in_process.py, and the embedded embedder's:
test_encoder_residency_in_process.py. Nothing here depends on what the model writes:
requests force their length with max_tokens and ignore_eos.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

import loopback
from conftest import RunningServer
from helpers import post
from ovtrio.model import embedded_model_path
from server_pool import server_fixture
from test_startup import gguf_with_architecture

NAMES = ("alpha", "beta", "gamma")
# Seconds after which a wait for the server's state is a hang (not a deadline: a busy
# machine's load or first token takes seconds).
HANG_CAP = 300
# Small KV caches: two models loaded at once beside the other test servers.
KV_BLOCKS = "64"


def models_folder(folder: Path) -> None:
    """The server's models: the embedded GGUF under three names (links: one model cache
    entry for all), and one file the engine cannot read."""
    models = folder / "models"
    models.mkdir()
    for name in NAMES:
        (models / f"{name}.gguf").symlink_to(embedded_model_path())
    gguf_with_architecture(models / "broken.gguf", "mamba")


def on_demand_server(name: str) -> Any:
    """A fixture: `ovtrio serve` over a folder of its own (models_folder), two models
    loaded at most."""
    flags = ("--models-max", "2", "--num-kv-blocks", KV_BLOCKS, "--no-embeddings")
    return server_fixture(name, "--models-dir", "{folder}/models", *flags, prepare=models_folder)


serve_on_demand = on_demand_server("serve_on_demand")


@pytest.fixture
def server(serve_on_demand: RunningServer) -> RunningServer:
    """The server, with every model unloaded (a models folder under the hypercorn
    command: test_launcher_parity.py)."""
    server = serve_on_demand
    for name in NAMES:
        reply = unload(server, name)
        assert reply.status_code == 200, reply.text
    return server


def chat_body(model: str, **params: Any) -> dict[str, Any]:
    """A chat whose length max_tokens forces (2 tokens unless it says otherwise)."""
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "ignore_eos": True}
    return {**body, **params}


def chat(server: RunningServer, model: str, **params: Any) -> httpx.Response:
    return post(server.base_url, "/v1/chat/completions", chat_body(model, **params))


class StreamUntilTold(threading.Thread):
    """A streamed chat of up to `max_tokens` tokens for `model`, read until `stop()`,
    which closes it; `ended` says whether the server had finished it first. The time
    it takes is the other work's, not its own length's."""

    def __init__(self, server: RunningServer, model: str, max_tokens: int) -> None:
        super().__init__()
        self.body = chat_body(model, max_tokens=max_tokens, stream=True)
        self.url = server.base_url + "/v1/chat/completions"
        self.stopping = threading.Event()
        self.status = 0
        self.ended = False

    def run(self) -> None:
        with loopback.stream("POST", self.url, json=self.body, timeout=HANG_CAP) as reply:
            self.status = reply.status_code
            for line in reply.iter_lines():
                if line == "data: [DONE]":
                    self.ended = True
                if self.stopping.is_set():
                    return

    def stop(self) -> None:
        self.stopping.set()
        self.join()


def wait_until_running(server: RunningServer, model: str) -> None:
    """Wait until `model` runs a request."""
    deadline = time.monotonic() + HANG_CAP
    while server.metric("ovtrio_requests_running", model_name=model) < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)


def chat_running(server: RunningServer, model: str, max_tokens: int) -> tuple[threading.Thread, list[httpx.Response]]:
    """A chat of `max_tokens` tokens for `model` in a thread, returned once the server
    runs it; its answer lands in the list."""
    done: list[httpx.Response] = []
    running = threading.Thread(target=lambda: done.append(chat(server, model, max_tokens=max_tokens)))
    running.start()
    wait_until_running(server, model)
    return running, done


def unload(server: RunningServer, model: str, **params: Any) -> httpx.Response:
    return loopback.post(server.base_url + "/models/unload", json={"model": model, **params}, timeout=120)


def states(server: RunningServer) -> dict[str, dict[str, Any]]:
    models = loopback.get(server.base_url + "/v1/models", timeout=30).json()["data"]
    return {model["id"]: model["status"] for model in models}


def count(server: RunningServer, name: str, **labels: str) -> float:
    """A counter's value; 0 before its first increment (a series is made then)."""
    try:
        return server.metric(name, **labels)
    except KeyError:
        return 0.0


def loads(server: RunningServer, model: str) -> float:
    return count(server, "ovtrio_model_loads_total", model_name=model)


def wait_for_state(server: RunningServer, model: str, state: str, timeout: float = HANG_CAP) -> None:
    deadline = time.monotonic() + timeout
    while states(server)[model]["value"] != state:
        assert time.monotonic() < deadline, f"{model} is {states(server)[model]}, not {state}"
        time.sleep(0.1)


def test_the_folder_is_listed_with_each_state_and_a_model_loads_on_its_first_request(server):
    listed = states(server)
    assert {name: listed[name]["value"] for name in NAMES} == dict.fromkeys(NAMES, "unloaded")
    # A file the engine cannot read is listed as failed, with the reason; asking for it is a 503 naming it.
    assert listed["broken"]["value"] == "failed" and "mamba" in listed["broken"]["reason"]
    refused = chat(server, "broken")
    assert refused.status_code == 503 and "mamba" in refused.json()["error"]["message"]
    assert int(refused.headers["retry-after"]) >= 1  # when the server would load it again
    # The server takes requests with every model unloaded.
    assert loopback.get(server.base_url + "/health/ready", timeout=10).status_code == 200

    reply = chat(server, "alpha")
    assert reply.status_code == 200 and reply.json()["model"] == "alpha"
    assert reply.json()["usage"]["completion_tokens"] == 2
    assert states(server)["alpha"]["value"] == "loaded" and states(server)["beta"]["value"] == "unloaded"
    assert server.metric("ovtrio_model_loaded", model_name="alpha") == 1
    assert server.metric("ovtrio_model_loaded", model_name="beta") == 0
    assert server.metric("ovtrio_model_load_seconds_count", model_name="alpha") >= 1
    # Unloaded by hand, as the router's route does it.
    before = count(server, "ovtrio_model_unloads_total", model_name="alpha", reason="request")
    assert unload(server, "alpha").json()["success"] is True
    assert states(server)["alpha"]["value"] == "unloaded"
    assert server.metric("ovtrio_model_unloads_total", model_name="alpha", reason="request") == before + 1


def test_the_least_recently_used_idle_model_makes_room(server):
    for name in ("alpha", "beta"):
        assert chat(server, name).status_code == 200
    # Each request's lease ends with its response: beta is now the least recently used.
    assert chat(server, "alpha").status_code == 200
    assert chat(server, "gamma").status_code == 200
    now = states(server)
    assert {name: now[name]["value"] for name in NAMES} == {"alpha": "loaded", "beta": "unloaded", "gamma": "loaded"}
    assert server.metric("ovtrio_model_unloads_total", model_name="beta", reason="lru") >= 1


def states_folder(server: RunningServer) -> str:
    """The models folder of `server` (beside its log)."""
    return str(server.log_path.parent / "models")


def _worker_pid(server: RunningServer) -> int:
    """The process that serves: `ovtrio serve` itself, or hypercorn's one worker (not
    multiprocessing's resource tracker beside it, nor a grammar compiler under either)."""
    pid = server.process.pid
    if b"hypercorn" not in Path(f"/proc/{pid}/cmdline").read_bytes():
        return pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    workers = [int(child) for child in children if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes()]
    assert len(workers) == 1, children
    return workers[0]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


# What 20 load/unload cycles may leave behind, in MB (measured: about 2 MB over 18; docs/models.md).
RSS_BOUND_MB = 30
CYCLES = int(os.environ.get("OVTRIO_TEST_CYCLES", "20"))


def test_memory_returns_after_twenty_load_and_unload_cycles(serve_on_demand):
    """Under one launcher: a cycle runs the registry's load and unload, which both
    launchers share (what each launcher's own loads give back is the test of a model
    loaded at start, below)."""
    server = serve_on_demand
    for name in NAMES:
        assert unload(server, name).status_code == 200
    pid = _worker_pid(server)
    # One cycle first: what the first load brings for good (modules, the tokenizer's
    # libraries) is not what an unload should return.
    assert chat(server, "alpha").status_code == 200
    assert unload(server, "alpha").status_code == 200
    before = _rss_mb(pid)
    for _ in range(CYCLES):
        assert chat(server, "alpha").status_code == 200
        assert unload(server, "alpha").status_code == 200
    after = _rss_mb(pid)
    assert after - before < RSS_BOUND_MB, (before, after)


def test_a_cached_model_loads_from_its_entry_with_engine_properties(tmp_path, caplog):
    """A load from the model cache lets the pipeline read the tokenizer itself (its
    constructor takes the properties as one mapping): precision hints and the compile
    cache go with it, and the entry loads as it is, not converted again."""
    from ovtrio.loading import load_model
    from ovtrio.loading.convert_cache import convert_into_cache
    from ovtrio.loading.load import compile_cache_folder
    from ovtrio.model import resolve_model
    from ovtrio.settings.server import Settings

    settings = Settings(cache_dir=str(tmp_path), num_kv_blocks=4, inference_precision="f32", compile_cache=True)
    source = resolve_model(settings)
    convert_into_cache(source, settings)
    model = load_model(source, settings)
    assert model.origin.startswith("cached in "), model.origin
    assert "tokenizer" not in model.phases  # read by the pipeline, in the same call
    assert model.tokenizer.encode("Hi").input_ids.data.size >= 1
    assert any(compile_cache_folder(settings).glob("*.blob"))
    # On CPU the blob cannot be imported back: the server says the flag slows loads.
    assert any("--compile-cache on CPU makes loads slower" in record.getMessage() for record in caplog.records)


def test_sigterm_drains_the_loaded_models_and_loads_no_other(tmp_path):
    from conftest import start_server

    models_folder(tmp_path)
    server = start_server(
        tmp_path, "--models-dir", str(tmp_path / "models"), "--num-kv-blocks", KV_BLOCKS, "--no-embeddings"
    )
    try:
        assert chat(server, "alpha").status_code == 200
        running, done = chat_running(server, "alpha", 100)
        server.process.send_signal(signal.SIGTERM)
        wait_for_state(server, "alpha", "loaded")  # still listening while it drains
        refused = chat(server, "beta")
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_shutting_down"
        # Loading by hand: no load begins; a model loaded already says so.
        load = loopback.post(server.base_url + "/models/load", json={"model": "beta"}, timeout=30)
        assert load.status_code == 503 and load.json()["error"]["code"] == "server_shutting_down", load.text
        loaded = loopback.post(server.base_url + "/models/load", json={"model": "alpha"}, timeout=30)
        assert loaded.status_code == 200 and loaded.json()["status"]["value"] == "loaded", loaded.text
        running.join()
        assert done[0].status_code == 200 and done[0].json()["choices"][0]["finish_reason"] == "length"
        assert server.process.wait(timeout=60) == 0
        assert states_logged(server) == 0, "beta was loaded during the drain"
    finally:
        if server.process.poll() is None:
            server.process.kill()


def states_logged(server: RunningServer) -> int:
    """How many times the server's log says it loaded beta."""
    return server.log_path.read_text().count("models/beta.gguf (gguf)")


def series_of(server: RunningServer, model: str) -> dict[str, float]:
    """Every sample on /metrics labelled with `model`, by name and other labels."""
    exposition = loopback.get(server.base_url + "/metrics", timeout=10)
    assert exposition.status_code == 200, exposition.text
    return {
        f"{sample.name}{sorted(sample.labels.items())}": sample.value
        for family in text_string_to_metric_families(exposition.text)
        for sample in family.samples
        if sample.labels.get("model_name") == model
    }


SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def structured(server: RunningServer, model: str) -> httpx.Response:
    """A request whose output the engine constrains: its pipeline builds a grammar compiler."""
    schema = {"name": "n", "schema": SCHEMA, "strict": True}
    return chat(server, model, max_tokens=4, response_format={"type": "json_schema", "json_schema": schema})


def test_an_unloaded_models_grammar_compiler_is_no_longer_read(server):
    """Each pipeline's grammar compiler is freed with it: the grammar cache's size, read
    every 2 s and on each scrape, must read only those of the loaded models."""
    baseline = server.metric("ovtrio_grammar_compilers")
    assert structured(server, "alpha").status_code == 200
    assert server.metric("ovtrio_grammar_compilers") == baseline + 1
    assert server.metric("ovtrio_grammar_cache_bytes") > 0
    assert unload(server, "alpha").status_code == 200
    assert server.metric("ovtrio_grammar_compilers") == baseline
    # Scrapes and the memory trimmer's looks (every 2 s) go on beside structured
    # requests to another model: the server stays up and the size stays that of a cache.
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        assert structured(server, "beta").status_code == 200
        held = server.metric("ovtrio_grammar_cache_bytes")
        assert 0 < held < 1_000_000_000
    assert server.process.poll() is None
    assert server.metric("ovtrio_grammar_compilers") == baseline + 1
    assert unload(server, "beta").status_code == 200
    assert server.metric("ovtrio_grammar_compilers") == baseline


# A model loaded at start beside the folder's, under each launcher: `ovtrio serve` hands
# the app the loads it began before importing it, hypercorn's app begins its own.
START = "start"
start_and_folder = server_fixture(
    "start_and_folder",
    "--model",
    str(embedded_model_path()),
    "--served-model-name",
    START,
    "--models-dir",
    "{folder}/models",
    "--num-kv-blocks",
    KV_BLOCKS,
    "--no-embeddings",
    prepare=models_folder,
)
hypercorn_start_and_folder = server_fixture(
    "hypercorn_start_and_folder",
    env={
        "OVTRIO_MODEL": str(embedded_model_path()),
        "OVTRIO_SERVED_MODEL_NAME": START,
        "OVTRIO_MODELS_DIR": "{folder}/models",
        "OVTRIO_NUM_KV_BLOCKS": KV_BLOCKS,
        "OVTRIO_EMBEDDINGS": "false",
    },
    hypercorn=True,
    prepare=models_folder,
)


@pytest.mark.parametrize("launcher", ["start_and_folder", "hypercorn_start_and_folder"])
def test_a_model_loaded_at_start_gives_its_memory_back_when_unloaded(launcher, request):
    server = request.getfixturevalue(launcher)
    pid = _worker_pid(server)
    assert chat(server, START).status_code == 200
    # A folder model's share: loaded once first (what a first load brings for good stays).
    assert chat(server, "alpha").status_code == 200
    assert unload(server, "alpha").status_code == 200
    assert chat(server, "alpha").status_code == 200
    loaded = _rss_mb(pid)
    assert unload(server, "alpha").status_code == 200
    unloaded = _rss_mb(pid)
    share = loaded - unloaded
    assert share > 100, (loaded, unloaded)  # the engine's weights, kernels and KV cache
    # The model loaded at start, the same file, gives back as much.
    assert unload(server, START).status_code == 200
    assert states(server)[START]["value"] == "unloaded"
    freed = unloaded - _rss_mb(pid)
    # Not always all of it (measured 0.69 of the share on one machine, 1.0 on two
    # others; likely pages its load shares with what the app's import, run beside it,
    # keeps). A model still held by someone frees nothing.
    assert freed > 0.5 * share, (share, freed)
    # And it loads again on demand.
    assert chat(server, START).status_code == 200


async def test_an_open_responses_socket_keeps_nothing_of_an_unloaded_model(serve_on_demand):
    """A socket that ran a response on a model and stays open (idle, or sending only
    frames that fail) must not keep the model's engine once it is unloaded."""
    from trio_websocket import open_websocket_url

    from test_responses_socket import receive_json, receive_response

    server = serve_on_demand
    pid = _worker_pid(server)
    # One cycle first: what the first load brings for good stays.
    assert chat(server, "alpha").status_code == 200
    assert unload(server, "alpha").status_code == 200
    before = _rss_mb(pid)
    create = {"type": "response.create", "model": "alpha", "input": "Hi", "max_output_tokens": 2, "ignore_eos": True}
    async with open_websocket_url(server.base_url.replace("http://", "ws://") + "/v1/responses") as ws:
        await ws.send_message(json.dumps(create))
        assert (await receive_response(ws))[-1]["response"]["usage"]["output_tokens"] == 2
        loaded = _rss_mb(pid)
        assert (await trio.to_thread.run_sync(unload, server, "alpha")).status_code == 200
        await ws.send_message("not json")
        assert (await receive_json(ws))["type"] == "error"
        unloaded = _rss_mb(pid)
    share = loaded - before
    assert share > 100, (before, loaded)
    assert unloaded - before < 0.3 * share, (before, loaded, unloaded)
