"""API keys: with keys set (flags, environment or a key file), every API route and the
Responses WebSocket handshake need `Authorization: Bearer <key>`; a refusal is a 401
in OpenAI's shape; the probes (and /metrics, unless protected) stay open; binding a
non-loopback address without a key logs a warning."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import openai
import pytest
import trio
from trio_websocket import ConnectionRejected, open_websocket_url

import loopback
from conftest import MODEL, free_port, held_loading
from helpers import assert_error
from in_process import in_process_server

FLAG_KEYS = ("first-key", "second-key")
FILE_KEYS = ("key-from-file",)

API_ROUTES = [
    ("GET", "/v1/models", None),
    ("GET", "/v3/models", None),
    ("GET", f"/v1/models/{MODEL}", None),
    (
        "POST",
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
    ),
    ("POST", "/v3/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2}),
    ("POST", "/v1/responses", {"model": MODEL, "input": "Hi", "max_output_tokens": 2}),
    ("GET", "/v1/responses/resp_unknown", None),
    ("POST", "/tokenize", {"prompt": "Hi"}),
    ("POST", "/v1/detokenize", {"tokens": [1, 2]}),
    ("GET", "/v1/no-such-route", None),
]


# Keys from two flags and a key file (with a comment), /metrics protected; the keys are
# the HTTP layer's, so the engine is the fake one.
keyed_server = in_process_server(
    "keyed_server",
    *(arg for key in FLAG_KEYS for arg in ("--api-key", key)),
    "--api-key-file",
    "{keys.txt}",
    "--protect-metrics",
    files={"keys.txt": "# operators' keys\n\n" + "\n".join(FILE_KEYS) + "\n"},
)


def call(server, method: str, path: str, body, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return loopback.request(method, server.base_url + path, json=body, headers=headers, timeout=60)


@pytest.mark.parametrize("method, path, body", API_ROUTES, ids=[f"{m} {p}" for m, p, _ in API_ROUTES])
def test_every_api_route_needs_a_key(keyed_server, method, path, body):
    missing = assert_error(call(keyed_server, method, path, body), 401, param=None)
    assert missing["code"] is None and "Authorization: Bearer" in missing["message"]  # OpenAI's words
    wrong = call(keyed_server, method, path, body, key="first-key-but-longer")
    assert_error(wrong, 401, param=None, code="invalid_api_key")
    assert wrong.headers["www-authenticate"] == "Bearer"
    for key in FLAG_KEYS + FILE_KEYS:
        assert call(keyed_server, method, path, body, key=key).status_code != 401


@pytest.mark.parametrize(
    "authorization", ["first-key", "Basic first-key", "Bearer", "Bearer first-key2", "bearer  wrong"]
)
def test_malformed_authorization_is_refused(keyed_server, authorization):
    response = loopback.get(keyed_server.v1 + "/models", headers={"Authorization": authorization}, timeout=30)
    assert response.status_code == 401, response.text


def test_the_scheme_is_case_insensitive(keyed_server):
    response = loopback.get(keyed_server.v1 + "/models", headers={"Authorization": "bearer first-key"}, timeout=30)
    assert response.status_code == 200, response.text


def test_probes_stay_open_and_metrics_can_be_protected(keyed_server):
    for path in ("/health", "/health/ready", "/ready", "/v2/health/live", "/v2/health/ready"):
        assert loopback.get(keyed_server.base_url + path, timeout=30).status_code == 200, path
    assert loopback.get(keyed_server.base_url + "/metrics", timeout=30).status_code == 401
    scraped = loopback.get(
        keyed_server.base_url + "/metrics", headers={"Authorization": "Bearer second-key"}, timeout=30
    )
    assert scraped.status_code == 200 and "ovtrio_requests_running" in scraped.text


def test_the_sdk_works_with_a_key_and_fails_without(keyed_server):
    with openai.OpenAI(base_url=keyed_server.v1, api_key="second-key", max_retries=0, timeout=120) as sdk:
        reply = sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
        assert reply.choices[0].finish_reason in ("length", "stop")
        with sdk.responses.connect() as connection:  # the handshake carries the key
            connection.response.create(model=MODEL, input="Hi", max_output_tokens=2, store=False)
            for event in connection:
                assert event.type != "error", event
                if event.type in ("response.completed", "response.incomplete"):
                    break
    with openai.OpenAI(base_url=keyed_server.v1, api_key="not-a-key", max_retries=0, timeout=120) as sdk:
        with pytest.raises(openai.AuthenticationError) as refused:
            sdk.models.list()
        assert refused.value.code == "invalid_api_key"


async def test_the_websocket_handshake_needs_a_key(keyed_server):
    url = keyed_server.base_url.replace("http://", "ws://") + "/v1/responses"
    for headers in ([], [(b"authorization", b"Bearer wrong")]):
        with pytest.raises(ConnectionRejected) as rejected:
            async with open_websocket_url(url, extra_headers=headers):
                pass
        assert rejected.value.status_code == 401
        error = json.loads(rejected.value.body)["error"]
        assert error["type"] == "invalid_request_error" and error["param"] is None
    async with open_websocket_url(url, extra_headers=[(b"authorization", b"Bearer key-from-file")]) as ws:
        await ws.send_message(
            json.dumps(
                {"type": "response.create", "model": MODEL, "input": "Hi", "max_output_tokens": 2, "store": False}
            )
        )
        with trio.fail_after(60):
            while (event := json.loads(await ws.get_message()))["type"] not in (
                "response.completed",
                "response.incomplete",
            ):
                assert event["type"] != "error", event


def test_a_key_from_the_environment_leaves_metrics_open(tmp_path):
    # Keys are checked before anything reaches the model: its load is held (never paid).
    with held_loading(tmp_path, env={"OVTRIO_API_KEY": "env-key"}) as loading:
        assert loopback.get(loading.base_url + "/v1/models", timeout=30).status_code == 401
        keyed = loopback.get(loading.base_url + "/v1/models", headers={"Authorization": "Bearer env-key"}, timeout=30)
        assert keyed.status_code == 200
        assert loopback.get(loading.base_url + "/metrics", timeout=30).status_code == 200


def serve_briefly(*args: str, until: str) -> str:
    """Start `ovtrio serve`, read its log until `until` appears (or it exits), stop it."""
    process = subprocess.Popen(
        [sys.executable, "-m", "ovtrio", "serve", "--port", str(free_port()), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "OVTRIO_API_KEY"},
    )
    output = ""
    try:
        assert process.stdout is not None
        for line in process.stdout:
            output += line
            if until in line:
                break
    finally:
        process.kill()  # only its log matters; a stop asked during its load may wait for the load
        process.wait(timeout=120)
    return output


def test_binding_every_address_without_a_key_warns():
    output = serve_briefly("--host", "0.0.0.0", until="loading")
    assert "listening on 0.0.0.0 without an API key" in output, output
    quiet = serve_briefly("--host", "0.0.0.0", "--api-key", "k", until="loading")
    assert "without an API key" not in quiet, quiet


def test_an_unreadable_key_file_is_refused_in_one_line(tmp_path):
    missing = tmp_path / "absent.txt"
    result = subprocess.run(
        [sys.executable, "-m", "ovtrio", "serve", "--port", str(free_port()), "--api-key-file", str(missing)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"ovtrio: cannot read API key file {missing}: No such file or directory"
    ]
