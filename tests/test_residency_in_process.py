"""The residency rules of models on demand (--models-dir, ovtrio/serving/residency.py)
on in-process servers over the fake engine (in_process.py), with the folder of
test_models_on_demand.py (the embedded GGUF linked under three names, and a file the
engine cannot read): which model loads, waits, makes room or unloads, what a request
that cannot have its model is told, how a lease keeps a model, and what /v1/models and
/metrics say meanwhile. A test holds a load (server.loads) or a model's steps
(server.steps) for as long as it looks, so every wait is on the server's own state.
What a real model's load and engine do (its first load from the folder, eviction
between real models, memory, the grammar compiler, a drain at SIGTERM) stays on the
real servers of test_models_on_demand.py.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

import loopback
from helpers import beside_innocent_streams
from in_process import InProcessServer, in_process_server
from ovtrio.model import embedded_model_path
from test_models_on_demand import (
    HANG_CAP,
    NAMES,
    StreamUntilTold,
    chat,
    chat_running,
    count,
    loads,
    models_folder,
    series_of,
    states,
    unload,
    wait_for_state,
    wait_until_running,
)
from test_startup import gguf_with_architecture

FOLDER = ("--models-dir", "{folder}/models", "--no-embeddings")
# Two models loaded at most; an unload waits for the requests of its model as long as a
# test holds them.
on_demand_in_process = in_process_server(
    "on_demand_in_process", *FOLDER, "--models-max", "2", "--drain-timeout", str(HANG_CAP), prepare=models_folder
)
# Loads only when asked, and unloads a model idle for 2 s.
by_hand_in_process = in_process_server(
    "by_hand_in_process", *FOLDER, "--no-models-autoload", "--model-idle-unload", "2", prepare=models_folder
)
# One model at a time, and a load waits at most 1 s for room.
one_at_a_time_in_process = in_process_server(
    "one_at_a_time_in_process", *FOLDER, "--models-max", "1", "--models-load-wait", "1", prepare=models_folder
)
# One model at a time, a load waits for room as long as a test may take, and an
# unload lets requests run on for 2 s.
room_in_a_while_in_process = in_process_server(
    "room_in_a_while_in_process",
    *FOLDER,
    "--models-max",
    "1",
    "--models-load-wait",
    str(HANG_CAP),
    "--drain-timeout",
    "2",
    prepare=models_folder,
)

REASONS = ("request", "idle", "lru")


def fresh(server: InProcessServer, *names: str) -> InProcessServer:
    """`server` with the folder's models (and `names`) unloaded."""
    for name in (*NAMES, *names):
        reply = unload(server, name)
        assert reply.status_code == 200, reply.text
    return server


@pytest.fixture
def server(on_demand_in_process: InProcessServer) -> InProcessServer:
    return fresh(on_demand_in_process)


def models_dir(server: InProcessServer) -> Path:
    return server.folder / "models"


def linked(server: InProcessServer, name: str) -> Path:
    """The embedded GGUF linked into the folder as `name`.gguf (again, if it was)."""
    added = models_dir(server) / f"{name}.gguf"
    added.unlink(missing_ok=True)
    added.symlink_to(embedded_model_path())
    return added


def service(server: InProcessServer, model: str) -> Any:
    (found,) = [service for service in server.registry.services if service.model_name == model]
    return found


def tokenizer_info(server: InProcessServer, model: str, method: str = "GET") -> httpx.Response:
    return loopback.request(method, server.base_url + "/tokenizer_info", params={"model": model}, timeout=30)


def lifecycle_agrees(server: InProcessServer, model: str) -> tuple[str, float, float]:
    """The model's state, and its loads and unloads as /metrics counts them."""
    unloads = sum(count(server, "ovtrio_model_unloads_total", model_name=model, reason=r) for r in REASONS)
    return states(server)[model]["value"], loads(server, model), unloads


def in_thread(call: Any, *args: Any, **params: Any) -> tuple[threading.Thread, list[Any]]:
    """`call(*args, **params)` in a thread, started; what it returns lands in the list."""
    done: list[Any] = []
    thread = threading.Thread(target=lambda: done.append(call(*args, **params)))
    thread.start()
    return thread, done


@contextmanager
def acquires_counted(server: InProcessServer) -> Iterator[Counter[str]]:
    """How many times a request has asked the residency for each model (Residency.acquire), in the block."""
    residency = server.registry.residency
    asked: Counter[str] = Counter()
    acquire = residency.acquire

    async def counted(service: Any, keep_alive: float | None = None) -> Any:
        asked[service.model_name] += 1
        return await acquire(service, keep_alive)

    residency.acquire = counted
    try:
        yield asked
    finally:
        del residency.acquire


def wait_until(what: Any, describe: str) -> None:
    """Poll `what()` (the server's state) until it is true; HANG_CAP bounds a hang."""
    waited = threading.Event()
    for _ in range(int(HANG_CAP / 0.02)):
        if what():
            return
        waited.wait(0.02)
    raise AssertionError(f"never: {describe}")


def test_the_least_recently_used_idle_model_makes_room(server):
    for name in ("alpha", "beta"):
        assert chat(server, name).status_code == 200
    # Each request's lease ends with its response: beta is now the least recently used.
    assert chat(server, "alpha").status_code == 200
    lru_before = count(server, "ovtrio_model_unloads_total", model_name="beta", reason="lru")
    alpha_loads = server.loads.count("alpha")
    assert chat(server, "gamma").status_code == 200
    now = states(server)
    assert {name: now[name]["value"] for name in NAMES} == {"alpha": "loaded", "beta": "unloaded", "gamma": "loaded"}
    assert count(server, "ovtrio_model_unloads_total", model_name="beta", reason="lru") == lru_before + 1
    assert server.loads.count("alpha") == alpha_loads  # alpha stayed: no load again


def test_concurrent_first_requests_share_one_load_while_health_stays_fast(server):
    """Four requests for an unloaded model and one that leaves while it loads: one load,
    and meanwhile the event loop answers probes at once and beta serves."""
    assert chat(server, "beta").status_code == 200
    before, counted_before = loads(server, "alpha"), server.loads.count("alpha")
    replies: list[httpx.Response] = []
    left: list[Exception] = []

    def leave() -> None:
        """A client that gives up while the model loads."""
        body = {"model": "alpha", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        try:
            loopback.post(server.base_url + "/v1/chat/completions", json=body, timeout=0.3)
        except httpx.TimeoutException as exc:
            left.append(exc)

    threads = [threading.Thread(target=lambda: replies.append(chat(server, "alpha"))) for _ in range(4)]
    leaving = threading.Thread(target=leave)
    with server.loads.held():
        for thread in [*threads, leaving]:
            thread.start()
        wait_for_state(server, "alpha", "loading")
        leaving.join()  # it left while alpha was held loading
        for _ in range(20):  # answered while the load is held (a real load's probes: test_uncached_gguf_load.py)
            assert loopback.get(server.base_url + "/health", timeout=10).status_code == 200
            assert chat(server, "beta").status_code == 200
        assert states(server)["alpha"]["value"] == "loading" and not replies
    for thread in threads:
        thread.join()
    assert [reply.status_code for reply in replies] == [200] * 4, [reply.text for reply in replies]
    assert len(left) == 1  # it left, and the load went on for the others
    assert loads(server, "alpha") == before + 1
    assert server.loads.count("alpha") == counted_before + 1


def test_a_request_during_its_models_unload_gets_a_clear_answer(server):
    assert chat(server, "alpha").status_code == 200
    alpha_loads = server.loads.count("alpha")
    with server.steps.held("alpha"), acquires_counted(server) as asked:
        running, finish = in_thread(chat, server, "alpha", max_tokens=150)
        wait_until_running(server, "alpha")
        # Refused while it runs a request, when the unload may not wait...
        busy = unload(server, "alpha", drain=False)
        assert busy.status_code == 409 and busy.json()["error"]["code"] == "model_busy", busy.text
        # ... and by default the request finishes before the engine goes.
        unloader, unloading = in_thread(unload, server, "alpha")
        wait_for_state(server, "alpha", "unloading")
        # A request that comes meanwhile waits for the unload, then loads the model again.
        asked_before = asked["alpha"]
        during_thread, during = in_thread(chat, server, "alpha")
        wait_until(lambda: asked["alpha"] > asked_before, "the request asked for alpha")
        assert states(server)["alpha"]["value"] == "unloading" and not during
    unloader.join()
    running.join()
    during_thread.join()
    assert finish[0].status_code == 200 and finish[0].json()["choices"][0]["finish_reason"] == "length"
    assert unloading[0].status_code == 200 and unloading[0].json()["ended_requests"] == 0
    assert during[0].status_code == 200, during[0].text
    assert states(server)["alpha"]["value"] == "loaded"
    assert server.loads.count("alpha") == alpha_loads + 1


def test_an_unload_whose_client_leaves_while_the_model_drains_still_ends(server):
    """The unload is the server's once asked: its client leaving while the model's
    request finishes neither stops it halfway nor leaves the model refusing requests."""
    assert chat(server, "alpha").status_code == 200
    with server.steps.held("alpha"):
        running, finish = in_thread(chat, server, "alpha", max_tokens=300)
        wait_until_running(server, "alpha")
        with pytest.raises(httpx.TimeoutException):  # it leaves while the model drains
            loopback.post(server.base_url + "/models/unload", json={"model": "alpha"}, timeout=0.3)
        wait_for_state(server, "alpha", "unloading")  # the server may read the unload after its client left
    running.join()
    assert finish[0].status_code == 200, finish[0].text
    assert finish[0].json()["usage"]["completion_tokens"] == 300
    wait_for_state(server, "alpha", "unloaded")
    reply = chat(server, "alpha")
    assert reply.status_code == 200, reply.text
    state, loaded, unloads = lifecycle_agrees(server, "alpha")
    assert (state, loaded - unloads) == ("loaded", 1), (state, loaded, unloads)


def test_a_model_copied_in_later_is_served_without_a_restart(server):
    added = linked(server, "delta")
    try:
        assert states(server)["delta"]["value"] == "unloaded"
        reply = chat(server, "delta")
        assert reply.status_code == 200 and reply.json()["model"] == "delta"
        assert server.loads.count("delta") == 1
        assert unload(server, "delta").status_code == 200
    finally:
        added.unlink()


def test_without_autoload_a_model_is_loaded_by_hand_and_unloads_when_idle(by_hand_in_process):
    server = fresh(by_hand_in_process)
    beta_loads = server.loads.count("beta")
    idle_before = count(server, "ovtrio_model_unloads_total", model_name="beta", reason="idle")
    refused = chat(server, "beta")
    assert refused.status_code == 404
    error = refused.json()["error"]
    assert error["code"] == "model_not_loaded" and error["param"] == "model"
    assert "POST /models/load" in error["message"]
    assert server.loads.count("beta") == beta_loads  # no load began for it
    loaded = loopback.post(server.base_url + "/models/load", json={"model": "beta"}, timeout=120)
    assert loaded.status_code == 200 and loaded.json()["status"]["value"] == "loaded"
    assert chat(server, "beta").status_code == 200
    # Idle for --model-idle-unload seconds: unloaded.
    wait_for_state(server, "beta", "unloaded")
    assert count(server, "ovtrio_model_unloads_total", model_name="beta", reason="idle") == idle_before + 1
    unknown = loopback.post(server.base_url + "/models/load", json={"model": "nothing"}, timeout=10)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"


def test_a_get_loads_no_model_and_makes_none_unload_for_its_room(server):
    # What an <img> tag on any page makes a browser send, with no key and no Origin.
    for name in ("alpha", "beta"):
        assert chat(server, name).status_code == 200
    # Both idle (their requests' leases have ended): a load of gamma would unload one of them.
    before, counted_before = loads(server, "gamma"), server.loads.count("gamma")
    for method in ("GET", "HEAD"):
        refused = tokenizer_info(server, "gamma", method)
        assert refused.status_code == 409, refused.text
    error = tokenizer_info(server, "gamma").json()["error"]
    assert error["code"] == "model_not_loaded" and error["param"] == "model"
    assert "unloaded" in error["message"] and "POST /models/load" in error["message"]
    now = states(server)
    assert {name: now[name]["value"] for name in NAMES} == {"alpha": "loaded", "beta": "loaded", "gamma": "unloaded"}
    assert loads(server, "gamma") == before and server.loads.count("gamma") == counted_before
    # A loaded model answers; one that failed says why, and is not loaded again for it.
    served = tokenizer_info(server, "alpha")
    assert served.status_code == 200 and served.json()["model"] == "alpha"
    broken = tokenizer_info(server, "broken")
    assert broken.status_code == 503 and "mamba" in broken.json()["error"]["message"]
    assert server.loads.count("broken") == 0


def test_gets_do_not_keep_a_model_from_unloading_when_idle(by_hand_in_process):
    server = fresh(by_hand_in_process)
    before = loads(server, "alpha")
    loaded = loopback.post(server.base_url + "/models/load", json={"model": "alpha"}, timeout=120)
    assert loaded.status_code == 200
    # The load's last write, its idle time's start, comes before /metrics counts it.
    wait_until(lambda: loads(server, "alpha") == before + 1, "the load was counted")
    used = service(server, "alpha").last_used

    def unloading_beside_gets() -> bool:
        assert tokenizer_info(server, "alpha").status_code in (200, 409)  # 409: unloading since
        assert service(server, "alpha").last_used == used, "a GET counted as a use of the model"
        return states(server)["alpha"]["value"] != "loaded"

    wait_until(unloading_beside_gets, "alpha left 'loaded' while GETs came")
    wait_for_state(server, "alpha", "unloaded")
    assert tokenizer_info(server, "alpha").status_code == 409


def test_keep_alive_zero_unloads_the_model_after_its_request(server):
    idle_before = count(server, "ovtrio_model_unloads_total", model_name="gamma", reason="idle")
    reply = chat(server, "gamma", keep_alive=0)
    assert reply.status_code == 200
    wait_for_state(server, "gamma", "unloaded")
    assert count(server, "ovtrio_model_unloads_total", model_name="gamma", reason="idle") == idle_before + 1
    for value in ("soon", "nan", "inf"):  # NaN never compares: the model would never unload
        bad = chat(server, "gamma", keep_alive=value)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "keep_alive", bad.text


def test_a_load_with_no_room_waits_then_is_a_503_with_retry_after(one_at_a_time_in_process):
    server = fresh(one_at_a_time_in_process)
    assert chat(server, "alpha").status_code == 200
    beta_loads = server.loads.count("beta")
    with server.steps.held("alpha"):
        running, done = chat_running(server, "alpha", 150)
        refused = chat(server, "beta")  # alpha runs its request all along: no room comes
        assert server.metric("ovtrio_requests_running", model_name="alpha") == 1
    running.join()
    assert refused.status_code == 503, refused.text
    error = refused.json()["error"]
    assert error["code"] == "model_unavailable" and "--models-max 1" in error["message"]
    assert int(refused.headers["Retry-After"]) >= 1
    assert server.loads.count("beta") == beta_loads  # it never began loading
    assert done[0].status_code == 200
    # Once alpha is idle (its requests' leases ended), beta takes its place.
    assert chat(server, "beta").status_code == 200
    now = states(server)
    assert (now["alpha"]["value"], now["beta"]["value"]) == ("unloaded", "loaded")


def test_the_counters_of_a_model_go_on_across_its_unload_and_next_load(server):
    """A counter read off the scheduler neither vanishes while its model is unloaded nor
    starts again from zero when it is loaded again (one Prometheus counter per model)."""
    assert chat(server, "beta", max_tokens=3).status_code == 200
    first = server.metric("ovtrio_generated_tokens_total", model_name="beta")
    steps = server.metric("ovtrio_engine_steps_total", model_name="beta")
    assert first >= 3
    assert unload(server, "beta").status_code == 200
    assert server.metric("ovtrio_generated_tokens_total", model_name="beta") == first
    assert server.metric("vllm:generation_tokens_total", model_name="beta", engine="0") == first
    with pytest.raises(KeyError):  # nothing runs in an unloaded model: no gauge
        server.metric("ovtrio_requests_running", model_name="beta")
    assert chat(server, "beta", max_tokens=3).status_code == 200
    assert server.metric("ovtrio_generated_tokens_total", model_name="beta") == first + 3
    assert server.metric("ovtrio_engine_steps_total", model_name="beta") > steps


def test_a_model_whose_file_is_gone_leaves_no_series_and_one_added_again_starts_afresh(server):
    """Forgotten (its file gone, and unloaded), a model takes all its series with it, the
    scheduler's and the request histograms alike; a file of that name copied in later
    is a new model, counted from zero."""
    added = linked(server, "epsilon")
    try:
        assert chat(server, "epsilon", max_tokens=3).status_code == 200
        assert series_of(server, "epsilon")["ovtrio_generated_tokens_total[('model_name', 'epsilon')]"] == 3
        added.unlink()
        assert unload(server, "epsilon").status_code == 200
        assert series_of(server, "epsilon") == {}  # before any listing: /metrics reads the folder too
        assert "epsilon" not in states(server)

        linked(server, "epsilon")
        assert chat(server, "epsilon", max_tokens=2).status_code == 200
        assert server.metric("ovtrio_generated_tokens_total", model_name="epsilon") == 2
        assert server.metric("vllm:generation_tokens_total", model_name="epsilon") == 2
        assert server.metric("vllm:request_generation_tokens_count", model_name="epsilon") == 1
        assert loads(server, "epsilon") == 1
        assert unload(server, "epsilon").status_code == 200
    finally:
        added.unlink(missing_ok=True)


def test_an_unload_asked_while_the_model_loads_is_counted(server):
    """The load goes on, then the unload: /metrics counts both, so loads minus unloads
    stays the number loaded."""
    beta_loads = server.loads.count("beta")
    with server.loads.held():
        asking, requested = in_thread(chat, server, "beta")
        wait_for_state(server, "beta", "loading")
        unloader, unloaded = in_thread(unload, server, "beta")
        wait_for_state(server, "beta", "unloading")  # asked while the load is held
    unloader.join()
    asking.join()
    assert unloaded[0].status_code == 200, unloaded[0].text
    # The request that came first waited through the unload, then loaded beta again.
    assert requested[0].status_code == 200, requested[0].text
    assert server.loads.count("beta") == beta_loads + 2
    state, loaded, unloads = lifecycle_agrees(server, "beta")
    assert (state, loaded - unloads) == ("loaded", 1), (state, loaded, unloads)
    assert unload(server, "beta").status_code == 200
    state, loaded, unloads = lifecycle_agrees(server, "beta")
    assert (state, loaded - unloads) == ("unloaded", 0), (state, loaded, unloads)


def test_an_unload_asked_while_the_load_waits_for_room_calls_the_load_off(room_in_a_while_in_process):
    """A model loaded before, asked for again while the one loaded model runs a request,
    waits for room; unloading it then answers at once (no load, no wait for room) and
    its waiting request gets a 503 with Retry-After, as when no room came."""
    server = fresh(room_in_a_while_in_process)
    assert chat(server, "alpha").status_code == 200
    assert unload(server, "alpha").status_code == 200
    assert chat(server, "beta").status_code == 200
    alpha_loads = server.loads.count("alpha")
    with server.steps.held("beta"):
        running, ran = in_thread(chat, server, "beta", max_tokens=1000)
        wait_until_running(server, "beta")
        asking, waiting = in_thread(chat, server, "alpha")
        wait_for_state(server, "alpha", "loading")
        unloaded = loopback.post(server.base_url + "/models/unload", json={"model": "alpha"}, timeout=HANG_CAP)
        # The unload did not wait for the load's room: beta's long chat still runs.
        assert server.metric("ovtrio_requests_running", model_name="beta") == 1, "the unload waited for the room"
        asking.join()
        assert unloaded.status_code == 200, unloaded.text
        assert waiting and waiting[0].status_code == 503 and "Retry-After" in waiting[0].headers, waiting
        assert states(server)["alpha"]["value"] == "unloaded"
        assert states(server)["beta"]["value"] == "loaded"
        assert server.loads.count("alpha") == alpha_loads  # called off before it began
        # Unloading beta ends its held request once the drain timeout (2 s) is over.
        unloader, beta_unloaded = in_thread(unload, server, "beta")
        running.join()
    unloader.join()
    # Its client is told the model went, and when to retry.
    assert ran[0].status_code == 503 and ran[0].json()["error"]["code"] == "model_unloaded", ran[0].text
    assert int(ran[0].headers["Retry-After"]) >= 1
    assert beta_unloaded[0].status_code == 200 and beta_unloaded[0].json()["ended_requests"] == 1, beta_unloaded
    assert chat(server, "alpha").status_code == 200


def test_loads_queued_behind_one_another_leave_it_room(server):
    """While alpha runs a long request, delta loads, and beta and gamma are asked for
    meanwhile: their loads wait their turn, one after the other, each unloading the
    model loaded before it once that is idle. A load waiting its turn holds no room, so
    beta's load does not wait for gamma's, which cannot begin before it (it did: until
    alpha was idle, or --models-load-wait ran out and beta got a 503)."""
    added = linked(server, "delta")
    try:
        assert chat(server, "alpha").status_code == 200
        with server.steps.held("alpha"):
            running = StreamUntilTold(server, "alpha", max_tokens=2000)
            running.start()
            wait_until_running(server, "alpha")
            replies: dict[str, httpx.Response] = {}

            def ask(name: str) -> threading.Thread:
                thread = threading.Thread(target=lambda: replies.__setitem__(name, chat(server, name)))
                thread.start()
                return thread

            with server.loads.held():
                asking = [ask("delta")]
                wait_for_state(server, "delta", "loading")
                asking += [ask("beta"), ask("gamma")]
                wait_for_state(server, "beta", "loading")
                wait_for_state(server, "gamma", "loading")
            for thread in asking:
                thread.join()
            # alpha's request ran all along (its steps are held: it cannot have ended).
            assert server.metric("ovtrio_requests_running", model_name="alpha") == 1
            running.stopping.set()
        running.join()
        assert {name: reply.status_code for name, reply in replies.items()} == dict.fromkeys(
            ("delta", "beta", "gamma"), 200
        ), {name: reply.text for name, reply in replies.items()}
        assert running.status == 200
        assert not running.ended, "beta or gamma waited for alpha's request to end"
    finally:
        for name in ("delta", *NAMES):
            assert unload(server, name).status_code == 200
        added.unlink()


def test_a_file_replaced_under_its_name_is_read_again_before_its_next_load(server):
    """Its context length, vocabulary and architecture are the new file's: a file the
    engine cannot read, put in place of one that served, is refused with the reason."""
    swapped = linked(server, "swapped")
    try:
        assert chat(server, "swapped").status_code == 200
        assert unload(server, "swapped").status_code == 200
        swapped_loads = server.loads.count("swapped")
        swapped.unlink()
        gguf_with_architecture(swapped, "mamba")
        answers: list[httpx.Response] = []

        def hostile() -> None:
            answers.append(chat(server, "swapped"))
            assert loopback.get(server.base_url + "/health", timeout=10).status_code == 200

        # Beside three streams of alpha: the replaced file fails itself, with the reason.
        beside_innocent_streams(server, hostile, model="alpha")
        refused = answers[0]
        assert refused.status_code == 503 and "mamba" in refused.json()["error"]["message"], refused.text
        assert server.loads.count("swapped") == swapped_loads  # refused before any load
        # And put back: read again, and served.
        linked(server, "swapped")
        assert chat(server, "swapped").status_code == 200
    finally:
        unload(server, "swapped")
        swapped.unlink(missing_ok=True)


def test_a_client_that_leaves_mid_stream_gives_its_models_lease_back(server):
    """A request holds its model until its response has ended: a client that leaves
    mid-stream ends it, and its model is held by nothing after (an unload that refuses
    a held model goes through), while three streams of another model end well."""

    assert chat(server, "alpha").status_code == 200  # loaded (its metrics exist)

    def leave_mid_stream() -> None:
        for _ in range(3):
            with server.steps.held("alpha"):
                leaving = StreamUntilTold(server, "alpha", max_tokens=2000)
                leaving.start()
                wait_until_running(server, "alpha")
                busy = unload(server, "alpha", drain=False)  # its lease holds the model
                assert busy.status_code == 409, busy.text
                leaving.stopping.set()  # it leaves at its next line, which the release sends
            leaving.join()
            assert leaving.status == 200 and not leaving.ended

    beside_innocent_streams(server, leave_mid_stream, model="beta", ignore_eos=True)
    # The server ends the left streams in a step or two.
    wait_until(lambda: unload(server, "alpha", drain=False).status_code != 409, "a left client's lease was given back")
    assert states(server)["alpha"]["value"] == "unloaded"


def test_a_load_that_fails_is_a_503_with_its_reason_until_an_unload_forgets_it(server):
    """The model is listed failed with the reason its load gave; a request is told why,
    with when to retry; unloaded by hand, its failure is forgotten and the next request
    loads it again."""
    gamma_loads = server.loads.count("gamma")
    server.loads.fail_next("the engine cannot compile gamma")
    refused = chat(server, "gamma")
    assert refused.status_code == 503, refused.text
    assert "the engine cannot compile gamma" in refused.json()["error"]["message"]
    assert int(refused.headers["Retry-After"]) >= 1
    listed = states(server)["gamma"]
    assert listed["value"] == "failed" and "the engine cannot compile gamma" in listed["reason"], listed
    assert server.loads.count("gamma") == gamma_loads + 1
    assert unload(server, "gamma").status_code == 200
    assert states(server)["gamma"]["value"] == "unloaded"
    assert chat(server, "gamma").status_code == 200
    assert server.loads.count("gamma") == gamma_loads + 2
    assert states(server)["gamma"]["value"] == "loaded"
