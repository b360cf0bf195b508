"""Ollama's routes over raw HTTP, where a client cannot express the case: NDJSON
framing, the body of any Content-Type, errors in Ollama's shape and statuses, every
hostile input beside three innocent streams, loads and unloads (an empty prompt,
keep_alive 0), the probe on `/` beside the playground, API keys, a full queue's 429,
metrics by route, and a client that leaves freeing its engine request. Every body and
record is checked against Ollama's Go types (ollama_schema.py).

Nothing here asserts what the model writes."""

from __future__ import annotations

import json
import signal
import threading
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from typing import Any

import httpx
import trio

import loopback
import ollama_schema
from conftest import MODEL, RunningServer
from server_pool import server_fixture
from test_messages import KEY, messages_limited_server, wait_for_metric  # noqa: F401 (keys, one running slot)
from test_shutdown import HANG_GUARD, Traffic, assert_phases, exit_code

STORY = [{"role": "user", "content": "Tell me a short story about a lighthouse keeper."}]
LONG = [{"role": "user", "content": "Count from 1 to 1000, one number per line."}]
# A reply the grammar holds to 600 characters: long on any CPU, and ended by the schema
# (or num_predict), not by the model.
LONG_STRING = {"type": "string", "minLength": 600, "maxLength": 600}

# A server of its own: its model is unloaded and loaded again here.
ollama_residency_server = server_fixture("ollama_residency_server", "--served-model-name", "residents/model:v1")
RESIDENT = "residents/model:v1"


def chat(server: RunningServer, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
    return loopback.post(server.base_url + "/api/chat", json=body, headers=headers, timeout=120)


def chat_body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": STORY, "options": {"num_predict": 8, "temperature": 0}, **fields}


def error_of(reply: httpx.Response, status: int, *mentions: str) -> str:
    """The reply is Ollama's error, `{"error": "..."}`, with `status`, naming `mentions`."""
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"].startswith("application/json")
    message = ollama_schema.check("StatusError", reply.json())["error"]
    for mention in mentions:
        assert mention in message, message
    return message


# ---- framing --------------------------------------------------------------------------------


def test_streams_are_ndjson_by_default(server):
    reply = chat(server, chat_body())
    assert reply.status_code == 200
    records = ollama_schema.records(reply)
    assert len(records) >= 2 and [r["done"] for r in records] == [False] * (len(records) - 1) + [True]
    assert all(r["model"] == MODEL and r["message"]["role"] == "assistant" for r in records)
    final = records[-1]
    assert final["message"]["content"] == "" and final["done_reason"] in ("stop", "length")
    unary = ollama_schema.body(chat(server, chat_body(stream=False)))
    assert unary["message"]["content"] == "".join(r["message"]["content"] for r in records)
    assert unary["eval_count"] == final["eval_count"] and unary["prompt_eval_count"] == final["prompt_eval_count"]


def test_a_body_of_any_content_type_is_read_as_json_unless_a_page_sent_it(server):
    text = json.dumps(chat_body(stream=False))
    form = {"Content-Type": "application/x-www-form-urlencoded"}  # what `curl -d` sends
    reply = loopback.post(server.base_url + "/api/chat", content=text, headers=form, timeout=120)
    assert ollama_schema.body(reply)["done"] is True
    page = {**form, "Origin": server.base_url}  # the server's own page: held to JSON
    refused = loopback.post(server.base_url + "/api/chat", content=text, headers=page, timeout=120)
    error_of(refused, 415, "application/json")
    # The OpenAI routes are held to JSON whoever sends the body.
    openai = loopback.post(server.base_url + "/v1/chat/completions", content=text, headers=form, timeout=120)
    assert openai.status_code == 415 and "type" in openai.json()["error"]


def test_measures_are_the_servers_own(server):
    for num_predict in (3, 12):
        # A reply the schema holds to 600 characters: num_predict ends it, on any CPU.
        options = {"num_predict": num_predict, "temperature": 0}
        body = chat_body(messages=LONG, stream=False, options=options, format=LONG_STRING)
        reply = ollama_schema.body(chat(server, body))
        assert reply["done_reason"] == "length" and reply["eval_count"] == num_predict
        assert reply["prompt_eval_duration"] > 0 and reply["eval_duration"] > 0
        assert reply["prompt_eval_duration"] + reply["eval_duration"] <= reply["total_duration"]
    # A longer prompt counts more prompt tokens, as the tokenizer counts them.
    tokens = loopback.post(
        server.base_url + "/tokenize", json={"model": MODEL, "messages": LONG, "add_generation_prompt": True}
    ).json()["count"]
    assert reply["prompt_eval_count"] == tokens


def test_the_probe_and_the_playground_share_the_root(server):
    probe = loopback.get(server.base_url + "/", headers={"Accept": "application/json"})
    assert probe.status_code == 200 and probe.text == "Ollama is running"
    assert probe.headers["content-type"].startswith("text/plain")
    assert loopback.get(server.base_url + "/").text == "Ollama is running"  # curl's */*
    head = loopback.request("HEAD", server.base_url + "/")
    assert head.status_code == 200 and head.headers["content-type"].startswith("text/plain")
    browser = loopback.get(server.base_url + "/", headers={"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"})
    assert browser.status_code == 200 and browser.headers["content-type"].startswith("text/html")
    assert "<html" in browser.text.lower()


def test_pages_of_other_origins_and_foreign_hosts_are_refused_in_ollamas_shape(server):
    body = chat_body(stream=False)
    error_of(chat(server, body, headers={"Origin": "http://evil.example"}), 403)
    error_of(chat(server, body, headers={"Host": "evil.example"}), 403)
    error_of(loopback.get(server.base_url + "/api/tags", headers={"Origin": "http://evil.example"}), 403)
    assert ollama_schema.body(chat(server, body, headers={"Origin": server.base_url}))["done"] is True


def test_unknown_paths_and_methods_under_api_answer_in_ollamas_shape(server):
    error_of(loopback.get(server.base_url + "/api/nothing"), 404)
    error_of(loopback.get(server.base_url + "/api/chat"), 405)


# ---- hostile inputs -------------------------------------------------------------------------

NESTED = "[" * 100_000 + "]" * 100_000

HOSTILE: list[tuple[str, Any, int, tuple[str, ...]]] = [
    ("/api/chat", {"messages": STORY}, 400, ("model",)),
    ("/api/chat", chat_body(model=""), 400, ("model",)),
    ("/api/chat", chat_body(model=7), 400, ("model",)),
    ("/api/chat", chat_body(model="no-such-model"), 404, ("no-such-model",)),
    ("/api/chat", chat_body(model=MODEL + ":7b"), 404, (MODEL + ":7b",)),
    ("/api/chat", chat_body(stream="yes"), 400, ("stream",)),
    ("/api/chat", chat_body(messages="Hi"), 400, ("messages",)),
    ("/api/chat", chat_body(messages=[{"role": "wizard", "content": "Hi"}]), 400, ("messages[0].role",)),
    ("/api/chat", chat_body(messages=[{"role": "user", "content": 5}]), 400, ("messages[0].content",)),
    ("/api/chat", chat_body(messages=[{"role": "user", "content": "Hi", "images": "abc"}]), 400, ("images",)),
    ("/api/chat", chat_body(messages=[{"role": "user", "content": "Hi", "images": ["!!"]}]), 400, ("images[0]",)),
    (
        "/api/chat",
        chat_body(
            messages=[
                *STORY,
                {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
            ]
        ),
        400,
        ("arguments",),
    ),
    (
        "/api/chat",
        chat_body(messages=[{"role": "user", "content": "Hi", "tool_calls": [{"function": {"name": "f"}}]}]),
        400,
        ("messages[0].tool_calls",),
    ),
    ("/api/chat", chat_body(options="hot"), 400, ("options",)),
    ("/api/chat", chat_body(options={"num_predict": "ten"}), 400, ("options.num_predict",)),
    ("/api/chat", chat_body(options={"num_predict": 2.5}), 400, ("options.num_predict",)),
    ("/api/chat", chat_body(options={"num_predict": 10**12}), 400, ("options.num_predict",)),
    ("/api/chat", chat_body(options={"num_predict": 10**30}), 400, ("options.num_predict",)),
    ("/api/chat", chat_body(options={"temperature": "hot"}), 400, ("options.temperature",)),
    ("/api/chat", chat_body(options={"temperature": 9.5}), 400, ("options.temperature",)),
    ("/api/chat", chat_body(options={"top_p": 0}), 400, ("options.top_p",)),
    ("/api/chat", chat_body(options={"top_k": 0}), 400, ("options.top_k",)),
    ("/api/chat", chat_body(options={"repeat_penalty": -1}), 400, ("options.repeat_penalty",)),
    ("/api/chat", chat_body(options={"seed": 2**40}), 400, ("options.seed",)),
    ("/api/chat", chat_body(options={"stop": "x"}), 400, ("options.stop",)),
    ("/api/chat", chat_body(options={"stop": [""]}), 400, ("options.stop",)),
    ("/api/chat", chat_body(options={"typical_p": 0.5}), 400, ("options.typical_p",)),
    ("/api/chat", chat_body(options={"mirostat": 2}), 400, ("options.mirostat",)),
    ("/api/chat", chat_body(options={"num_ctx": "big"}), 400, ("options.num_ctx",)),
    ("/api/chat", chat_body(options={"tool_choice": "required"}), 400, ("options.tool_choice",)),
    ("/api/chat", chat_body(format="yaml"), 400, ("format",)),
    ("/api/chat", chat_body(format=5), 400, ("format",)),
    ("/api/chat", chat_body(format={"type": "nonsense"}), 400, ("format",)),
    ("/api/chat", chat_body(format={"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}), 400, ("format",)),
    ("/api/chat", chat_body(format={"type": "string", "description": "x" * 200_000}), 400, ("format", "bytes")),
    ("/api/chat", chat_body(tools=[{"type": "function", "function": {"name": "bad name!"}}]), 400, ("tools[0]",)),
    (
        "/api/chat",
        chat_body(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]),
        400,
        ("tools[0].function.parameters",),
    ),
    ("/api/chat", chat_body(think="extreme"), 400, ("think",)),
    ("/api/chat", chat_body(think=True), 400, ("think",)),
    ("/api/chat", chat_body(keep_alive="forever"), 400, ("keep_alive",)),
    ("/api/chat", chat_body(keep_alive=True), 400, ("keep_alive",)),
    ("/api/chat", chat_body(keep_alive="NaN"), 400, ("keep_alive",)),
    ("/api/chat", chat_body(logprobs="yes"), 400, ("logprobs",)),
    ("/api/chat", chat_body(logprobs=True, top_logprobs=5), 400, ("top_logprobs",)),
    ("/api/chat", chat_body(top_logprobs=-1), 400, ("top_logprobs",)),
    ("/api/chat", NESTED, 400, ()),
    ("/api/chat", {"model": MODEL, "messages": STORY, "options": json.loads("[" * 500 + "]" * 500)}, 400, ()),
    ("/api/chat", "not json", 400, ()),
    ("/api/generate", {"model": MODEL, "prompt": "Hi", "template": "{{ .Prompt }}"}, 400, ("template",)),
    ("/api/generate", {"model": MODEL, "prompt": "Hi", "suffix": "end"}, 400, ("suffix",)),
    ("/api/generate", {"model": MODEL, "prompt": "Hi", "context": [1, 2, 3]}, 400, ("context",)),
    ("/api/generate", {"model": MODEL, "prompt": 5}, 400, ("prompt",)),
    ("/api/generate", {"model": MODEL, "prompt": "Hi", "images": ["bm90"]}, 400, ("images[0]",)),
    ("/api/generate", {"model": MODEL, "prompt": "x " * 20_000}, 400, ("prompt",)),
    (
        "/api/generate",
        {"model": MODEL, "prompt": "Hi", "options": {"num_predict": 9000}},
        400,
        ("options.num_predict",),
    ),
    ("/api/embed", {"model": "all-MiniLM-L6-v2", "input": 5}, 400, ("input",)),
    ("/api/embed", {"model": "all-MiniLM-L6-v2", "input": [""]}, 400, ("input",)),
    ("/api/embed", {"model": "all-MiniLM-L6-v2", "input": "x", "dimensions": 3}, 400, ("dimensions",)),
    ("/api/embed", {"model": "all-MiniLM-L6-v2", "input": "word " * 5000, "truncate": False}, 400, ("input",)),
    ("/api/embed", {"model": MODEL, "input": "x"}, 400, (MODEL,)),
    ("/api/embeddings", {"model": "all-MiniLM-L6-v2", "prompt": ["x"]}, 400, ("prompt",)),
    ("/api/embeddings", {"model": "no-such-model", "prompt": ""}, 404, ("no-such-model",)),
    ("/api/embed", {"model": "no-such-model", "input": []}, 404, ("no-such-model",)),
    ("/api/show", {}, 400, ("model",)),
    ("/api/show", {"model": "no-such-model"}, 404, ("no-such-model",)),
    ("/api/pull", {"model": MODEL}, 400, ("models folder",)),
    ("/api/create", {"model": "x", "from": MODEL}, 400, ("models folder",)),
]


def _hostile_requests(server: RunningServer) -> None:
    for path, body, status, mentions in HOSTILE:
        content = body if isinstance(body, str) else json.dumps(body)
        reply = loopback.post(
            server.base_url + path, content=content, headers={"Content-Type": "application/json"}, timeout=120
        )
        error_of(reply, status, *mentions)
    for method, path in (("DELETE", "/api/delete"), ("POST", "/api/copy"), ("POST", "/api/push")):
        error_of(loopback.request(method, server.base_url + path, json={"model": MODEL}), 400, "models folder")


def _innocent_stream(base_url: str, finished: list[str]) -> None:
    body = chat_body(messages=LONG, options={"num_predict": 24, "temperature": 0})
    with httpx.stream("POST", base_url + "/api/chat", json=body, timeout=600) as reply:
        assert reply.status_code == 200
        records = [ollama_schema.check_record("/api/chat", json.loads(line)) for line in reply.iter_lines() if line]
    finished.append(records[-1]["done_reason"])


def test_hostile_inputs_beside_three_innocent_streams(server):
    finished: list[str] = []
    streams = [threading.Thread(target=_innocent_stream, args=(server.base_url, finished)) for _ in range(3)]
    for stream in streams:
        stream.start()
    try:
        _hostile_requests(server)
    finally:
        for stream in streams:
            stream.join(timeout=600)
    assert len(finished) == 3 and set(finished) <= {"length", "stop"}, finished
    wait_for_metric(server, "ovtrio_requests_running", 0)


# ---- loads, unloads and keep_alive ----------------------------------------------------------


def running_names(server: RunningServer) -> list[str]:
    body = ollama_schema.body(loopback.get(server.base_url + "/api/ps"))
    return [model["name"] for model in body["models"]]


def state_of(server: RunningServer, name: str) -> str:
    cards = loopback.get(server.base_url + "/v1/models").json()["data"]
    return next(card["status"]["value"] for card in cards if card["id"] == name)


def wait_for_state(server: RunningServer, name: str, state: str) -> None:
    deadline = time.monotonic() + 120  # a cap on a wait for the server's own state, not a measure
    while state_of(server, name) != state:
        assert time.monotonic() < deadline, f"{name} is {state_of(server, name)}, not {state}"
        time.sleep(0.05)


def test_an_empty_prompt_loads_and_keep_alive_0_unloads(ollama_residency_server):
    server = ollama_residency_server
    generate = server.base_url + "/api/generate"
    # A name that holds a ':' of its own is reached by it, and listed by it.
    listed = [m["name"] for m in ollama_schema.body(loopback.get(server.base_url + "/api/tags"))["models"]]
    assert RESIDENT in listed and RESIDENT + ":latest" not in listed
    loaded = ollama_schema.records(loopback.post(generate, json={"model": RESIDENT}, timeout=120))
    assert [(r["done"], r["done_reason"], r["response"]) for r in loaded] == [(True, "load", "")]
    assert RESIDENT in running_names(server)

    unloaded = loopback.post(generate, json={"model": RESIDENT, "keep_alive": 0, "stream": False}, timeout=120)
    assert ollama_schema.body(unloaded)["done_reason"] == "unload"
    assert state_of(server, RESIDENT) == "unloaded" and running_names(server) == []

    # The next request loads it again, and its load_duration says so.
    cold = ollama_schema.body(chat(server, chat_body(model=RESIDENT, stream=False)))
    warm = ollama_schema.body(chat(server, chat_body(model=RESIDENT, stream=False)))
    assert cold["load_duration"] > 100 * warm["load_duration"]
    assert cold["prompt_eval_count"] == warm["prompt_eval_count"]

    # A chat with no messages loads (or unloads) as well.
    empty = ollama_schema.body(chat(server, {"model": RESIDENT, "messages": [], "stream": False, "keep_alive": "0s"}))
    assert empty["done_reason"] == "unload" and empty["message"] == {"role": "assistant", "content": ""}
    assert state_of(server, RESIDENT) == "unloaded"

    # keep_alive 0 on a request: the model is unloaded once its response has ended.
    reply = ollama_schema.body(chat(server, chat_body(model=RESIDENT, stream=False, keep_alive=0)))
    assert reply["done"] is True
    wait_for_state(server, RESIDENT, "unloaded")

    # keep_alive as a duration: the expiry /api/ps shows.
    ollama_schema.body(chat(server, chat_body(model=RESIDENT, stream=False, keep_alive="1h30m")))
    (process,) = ollama_schema.body(loopback.get(server.base_url + "/api/ps"))["models"]
    expires = datetime.fromisoformat(process["expires_at"].replace("Z", "+00:00"))
    assert 89 * 60 < (expires - datetime.now(UTC)).total_seconds() <= 90 * 60
    assert process["size"] > 0 and process["size_vram"] == 0 and process["context_length"] > 0
    forever = ollama_schema.body(chat(server, chat_body(model=RESIDENT, stream=False, keep_alive=-1)))
    assert forever["done"] is True
    (process,) = ollama_schema.body(loopback.get(server.base_url + "/api/ps"))["models"]
    assert datetime.fromisoformat(process["expires_at"].replace("Z", "+00:00")).year > 2200


def go_body(fields: dict[str, Any]) -> bytes:
    """A body as Go's encoding/json writes Ollama's request types: fields without
    `omitempty` always sent (empty strings, false, null options)."""
    return json.dumps(fields).encode()


def test_what_ollamas_own_cli_sends(ollama_residency_server):
    """`ollama run`, `ollama ps`, `ollama list` and `ollama stop` over the wire, as its Go
    client sends them (cmd/cmd.go, api/client.go): heartbeat, show, a preload with
    think, the chat, and the unload, with Go's empty fields and durations ("5m0s")."""
    server = ollama_residency_server
    json_type = {"Content-Type": "application/json", "Accept": "application/x-ndjson"}

    def post(path: str, fields: dict[str, Any]) -> httpx.Response:
        return loopback.post(server.base_url + path, content=go_body(fields), headers=json_type, timeout=120)

    assert loopback.request("HEAD", server.base_url + "/").status_code == 200  # client.Heartbeat
    version = ollama_schema.body(loopback.get(server.base_url + "/api/version"))["version"]
    assert version.count(".") == 2
    show = {"model": RESIDENT, "system": "", "template": "", "verbose": False, "options": None, "name": ""}
    shown = ollama_schema.body(post("/api/show", show))
    assert "completion" in shown["capabilities"]
    empty = {"prompt": "", "suffix": "", "system": "", "template": "", "options": None}
    preload = {"model": RESIDENT, **empty, "keep_alive": "5m0s", "think": False}
    assert [r["done_reason"] for r in ollama_schema.records(post("/api/generate", preload))] == ["load"]
    chat_request = {
        "model": RESIDENT,
        "messages": [{"role": "user", "content": "Hello!"}],
        "options": {"num_predict": 4},
        "keep_alive": "5m0s",
    }
    records = ollama_schema.records(post("/api/chat", chat_request))
    assert records[-1]["done"] is True and records[-1]["eval_count"] <= 4
    assert RESIDENT in running_names(server)  # ollama ps
    assert RESIDENT in [m["name"] for m in ollama_schema.body(loopback.get(server.base_url + "/api/tags"))["models"]]
    stop = {"model": RESIDENT, **empty, "keep_alive": "0s"}  # ollama stop
    assert [r["done_reason"] for r in ollama_schema.records(post("/api/generate", stop))] == ["unload"]
    assert running_names(server) == []


# ---- keys, admission, metrics, disconnects --------------------------------------------------


def test_api_keys_guard_the_ollama_routes(messages_limited_server):
    server = messages_limited_server
    error_of(chat(server, chat_body(stream=False)), 401)
    error_of(loopback.get(server.base_url + "/api/tags"), 401)
    keyed = {"Authorization": f"Bearer {KEY}"}
    assert ollama_schema.body(chat(server, chat_body(stream=False), headers=keyed))["done"] is True
    assert ollama_schema.body(loopback.get(server.base_url + "/api/tags", headers=keyed))["models"]


def test_a_full_queue_is_429_in_ollamas_shape(messages_limited_server):
    server = messages_limited_server
    keyed = {"Authorization": f"Bearer {KEY}"}
    # The one running slot, held by a stream that runs until it is closed (ignore_eos).
    hold = {"model": MODEL, "messages": LONG, "max_tokens": 4000, "ignore_eos": True, "stream": True}
    queued: list[httpx.Response] = []
    with ExitStack() as stack:
        http = stack.enter_context(httpx.Client(base_url=server.base_url, timeout=120, headers=keyed))
        holder = stack.enter_context(http.stream("POST", "/v1/chat/completions", json=hold))
        assert holder.status_code == 200
        lines = holder.iter_lines()  # kept: a closed line iterator closes the connection
        next(lines)
        waiting = threading.Thread(target=lambda: queued.append(chat(server, chat_body(stream=False), keyed)))
        waiting.start()
        wait_for_metric(server, "ovtrio_requests_waiting", 1)  # the queue is full now
        refused = chat(server, chat_body(stream=False), headers=keyed)
        error_of(refused, 429)
        assert int(refused.headers["retry-after"]) >= 1
    waiting.join(timeout=300)
    (reply,) = queued  # it ran once the slot was free
    assert ollama_schema.body(reply)["done"] is True
    wait_for_metric(server, "ovtrio_requests_running", 0)


def test_a_client_that_leaves_frees_its_engine_request(server):
    aborted = server.metric("vllm:request_success_total", finished_reason="abort")
    with ExitStack() as stack:
        http = stack.enter_context(httpx.Client(base_url=server.base_url, timeout=60))
        body = chat_body(messages=LONG, format=LONG_STRING, options={"num_predict": 3000})
        reply = stack.enter_context(http.stream("POST", "/api/chat", json=body))
        lines = reply.iter_lines()  # kept: a closed line iterator closes the connection
        for _, line in zip(range(3), lines):
            ollama_schema.check_record("/api/chat", json.loads(line))
        assert server.metric("ovtrio_requests_running") == 1
    wait_for_metric(server, "ovtrio_requests_running", 0)
    wait_for_metric(server, "ovtrio_engine_requests", 0)
    assert server.metric("vllm:request_success_total", finished_reason="abort") == aborted + 1


def test_the_routes_show_in_request_metrics(server):
    def count(method: str, route: str, status: str) -> float:
        try:
            return server.metric("ovtrio_http_responses_total", method=method, route=route, status=status)
        except KeyError:
            return 0.0

    routes = [("POST", "/api/chat", "200"), ("POST", "/api/generate", "200"), ("GET", "/api/tags", "200")]
    routes.append(("POST", "/api/chat", "400"))
    before = [count(*route) for route in routes]
    chat(server, chat_body(stream=False))
    loopback.post(
        server.base_url + "/api/generate", json={"model": MODEL, "prompt": "Hi", "options": {"num_predict": 1}}
    )
    loopback.get(server.base_url + "/api/tags")
    chat(server, chat_body(options={"num_predict": "many"}))
    assert [count(*route) - was for route, was in zip(routes, before)] == [1, 1, 1, 1]


# ---- the drain --------------------------------------------------------------------------

# Room for the replies below to end by their schema on a busy machine, however long
# their tokens make them.
DRAIN_SECONDS = 300
ollama_draining_server = server_fixture("ollama_draining_server", "--drain-timeout", str(DRAIN_SECONDS))


# Replies the grammar holds to this many characters: they outlast the signal's handling
# however long the model's tokens are, and end by the schema.
DRAINED_CHARS = 1000


async def test_sigterm_lets_ollama_requests_finish_and_refuses_new_ones(server_pool):
    server = server_pool.take("ollama_draining_server")
    schema = {"type": "string", "minLength": DRAINED_CHARS, "maxLength": DRAINED_CHARS}
    options = {"num_predict": 4 * DRAINED_CHARS}
    try:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=DRAIN_SECONDS) as http:
            with trio.fail_after(DRAIN_SECONDS + HANG_GUARD):
                async with trio.open_nursery() as nursery:
                    traffic = Traffic(server, http, nursery)
                    chat_request = {"model": MODEL, "messages": STORY, "format": schema, "options": options}
                    traffic.stream("chat", "/api/chat", chat_request)
                    prompt = {"model": MODEL, "prompt": "Write.", "format": schema, "options": options}
                    traffic.unary("generate", "/api/generate", {**prompt, "stream": False})
                    await traffic.all_running()
                    server.process.send_signal(signal.SIGTERM)
                    while (await http.get("/health/ready")).status_code == 200:  # the signal is on its way
                        await trio.sleep(0.01)
                    for path, late in (("/api/chat", chat_body()), ("/api/generate", {"model": MODEL, "prompt": "Hi"})):
                        refused = await http.post(path, json=late)
                        error_of(refused, 503, "shutting down")
                        assert int(refused.headers["Retry-After"]) >= 0
            assert await exit_code(server.process) == 0
    finally:
        if server.process.poll() is None:
            server.process.kill()
    records = [
        ollama_schema.check_record("/api/chat", json.loads(line))
        for line in traffic.results["chat"].split("\n")
        if line
    ]
    assert [record for record in records if "error" in record] == []
    assert records[-1]["done_reason"] == "stop"
    assert len(json.loads("".join(r["message"]["content"] for r in records))) == DRAINED_CHARS
    generated = traffic.results["generate"]
    assert generated.status_code == 200
    response = ollama_schema.check_record("/api/generate", generated.json())["response"]
    assert len(json.loads(response)) == DRAINED_CHARS
    assert_phases(server, "serve", 2, "drained in")
