"""Web pages cannot use the server through their visitors' browsers unless allowed:
the Host and Origin checks, CORS, and JSON-only request bodies (ovtrio/api/origins.py,
ovtrio/api/json_bodies.py).

Each attack is tried from a real page on another origin in headless Chromium (tests
marked `browser`), and with crafted headers against `ovtrio serve` and `hypercorn -k
trio ovtrio.app:app`; the policy's rules are also checked on their own.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import pytest

import loopback
from browser import REBOUND_DOMAIN, browser, page, page_server_fixture  # noqa: F401 (fixtures)
from conftest import MODEL, RunningServer
from guarded_servers import PAGE_ORIGIN, PAGE_PORT, open_hypercorn, origin_server  # noqa: F401 (fixtures)
from ovtrio.api.json_bodies import refusal as body_refusal
from ovtrio.api.origins import OriginPolicy
from ovtrio.settings.server import SettingsError, settings_from_env
from test_api_keys import FLAG_KEYS, keyed_server  # noqa: F401 (fixture)

page_server = page_server_fixture(PAGE_PORT)

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
JSON = {"Content-Type": "application/json"}


def port_of(server: RunningServer) -> int:
    return int(server.base_url.rsplit(":", 1)[1])


def post_chat(server: RunningServer, headers: dict[str, str], content: bytes | None = None) -> Any:
    body = json.dumps(CHAT).encode() if content is None else content
    return loopback.post(server.base_url + "/v1/chat/completions", content=body, headers=headers, timeout=120)


def assert_refused(response: Any, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["type"] == "invalid_request_error"


def raw_handshake(port: int, host: str, origin: str | None = None) -> bytes:
    """The status line of the server's answer to a WebSocket handshake with these headers."""
    request = (
        f"GET /v1/responses HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        + (f"Origin: {origin}\r\n" if origin else "")
        + "\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(request)
        reply = b""
        while b"\r\n" not in reply:
            chunk = sock.recv(4096)
            if not chunk:
                break
            reply += chunk
    return reply.split(b"\r\n", 1)[0]


# --- Host ---------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "attacker.test", "127.0.0.2:{port}"])
def test_a_host_that_is_not_loopback_is_refused(server, host):
    host = host.format(port=port_of(server))
    for path in ("/v1/models", "/v1/no-such-route"):
        response = loopback.get(server.base_url + path, headers={"Host": host}, timeout=30)
        assert_refused(response, 403, "host_not_allowed")
    assert_refused(post_chat(server, {**JSON, "Host": host}), 403, "host_not_allowed")


@pytest.mark.parametrize("host", ["localhost", "localhost:{port}", "127.0.0.1:{port}", "[::1]:{port}", "LOCALHOST:1"])
def test_loopback_names_pass_with_any_port(server, host):
    response = loopback.get(server.base_url + "/v1/models", headers={"Host": host.format(port=port_of(server))})
    assert response.status_code == 200, response.text


def test_probes_answer_any_host(server):
    for path in ("/health", "/health/ready"):
        assert loopback.get(server.base_url + path, headers={"Host": "evil.example"}, timeout=30).status_code == 200


def test_websocket_handshake_checks_host_and_origin(server):
    port = port_of(server)
    assert raw_handshake(port, f"127.0.0.1:{port}").startswith(b"HTTP/1.1 101")
    assert raw_handshake(port, f"127.0.0.1:{port}", origin=f"http://127.0.0.1:{port}").startswith(b"HTTP/1.1 101")
    assert raw_handshake(port, "evil.example").startswith(b"HTTP/1.1 403")
    assert raw_handshake(port, f"127.0.0.1:{port}", origin="http://evil.example").startswith(b"HTTP/1.1 403")
    assert raw_handshake(port, f"127.0.0.1:{port}", origin="null").startswith(b"HTTP/1.1 403")


def test_hypercorn_entry_point_checks_host_and_origin(hypercorn_server):
    port = port_of(hypercorn_server)
    models = hypercorn_server.base_url + "/v1/models"
    assert_refused(loopback.get(models, headers={"Host": "evil.example"}, timeout=30), 403, "host_not_allowed")
    foreign = loopback.get(models, headers={"Origin": "http://evil.example"}, timeout=30)
    assert_refused(foreign, 403, "origin_not_allowed")
    own = {"Origin": f"http://localhost:{port}", "Host": f"localhost:{port}"}
    assert loopback.get(models, headers=own, timeout=30).status_code == 200
    assert raw_handshake(port, f"127.0.0.1:{port}", origin="http://evil.example").startswith(b"HTTP/1.1 403")


# --- Origin and CORS ----------------------------------------------------------------


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://127.0.0.1:1", "https://localhost"])
def test_a_foreign_origin_is_refused(server, origin):
    assert_refused(post_chat(server, {**JSON, "Origin": origin}), 403, "origin_not_allowed")
    preflight = loopback.request(
        "OPTIONS",
        server.base_url + "/v1/chat/completions",
        headers={"Origin": origin, "Access-Control-Request-Method": "POST"},
    )
    assert_refused(preflight, 403, "origin_not_allowed")
    assert "access-control-allow-origin" not in preflight.headers


def test_same_origin_and_no_origin_pass(server):
    own = server.base_url  # http://127.0.0.1:PORT, as the Host header says
    same = post_chat(server, {**JSON, "Origin": own})
    assert same.status_code == 200, same.text
    assert "access-control-allow-origin" not in same.headers
    assert post_chat(server, JSON).status_code == 200


def test_allowed_origin_gets_preflight_and_cors_headers(origin_server):
    url = origin_server.base_url + "/v1/chat/completions"
    preflight = loopback.request(
        "OPTIONS",
        url,
        headers={
            "Origin": PAGE_ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os",
            "Access-Control-Request-Private-Network": "true",
        },
    )
    assert preflight.status_code == 204, preflight.text
    assert preflight.headers["access-control-allow-origin"] == PAGE_ORIGIN
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert preflight.headers["access-control-allow-headers"] == "authorization, content-type, x-stainless-os"
    assert "origin" in preflight.headers["vary"].lower()
    assert preflight.headers["access-control-allow-private-network"] == "true"

    answered = post_chat(origin_server, {**JSON, "Origin": PAGE_ORIGIN})
    assert answered.status_code == 200 and answered.headers["access-control-allow-origin"] == PAGE_ORIGIN
    assert "origin" in answered.headers["vary"].lower()
    # Errors too, so the page can read why.
    bad = post_chat(origin_server, {**JSON, "Origin": PAGE_ORIGIN}, content=b"{")
    assert bad.status_code == 400 and bad.headers["access-control-allow-origin"] == PAGE_ORIGIN
    # Another origin is still refused.
    assert_refused(post_chat(origin_server, {**JSON, "Origin": "http://evil.example"}), 403, "origin_not_allowed")


def test_origin_is_checked_before_the_key_and_a_preflight_needs_none(keyed_server):
    url = keyed_server.base_url + "/v1/chat/completions"
    own = {"Origin": keyed_server.base_url, "Access-Control-Request-Method": "POST"}
    preflight = loopback.request("OPTIONS", url, headers={**own, "Access-Control-Request-Headers": "authorization"})
    assert preflight.status_code == 204, preflight.text  # a browser's preflight never carries the key
    assert preflight.headers["access-control-allow-headers"] == "authorization"
    foreign = post_chat(keyed_server, {**JSON, "Origin": "http://evil.example"})
    assert_refused(foreign, 403, "origin_not_allowed")
    keyed = post_chat(
        keyed_server, {**JSON, "Origin": keyed_server.base_url, "Authorization": f"Bearer {FLAG_KEYS[0]}"}
    )
    assert keyed.status_code == 200, keyed.text


def test_any_origin_when_asked(open_hypercorn):
    answered = post_chat(open_hypercorn, {**JSON, "Origin": "http://anywhere.example"})
    assert answered.status_code == 200, answered.text
    assert answered.headers["access-control-allow-origin"] == "*"


# --- JSON bodies ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        None,
    ],
)
def test_a_body_that_is_not_json_is_refused_with_415(server, content_type):
    headers = {} if content_type is None else {"Content-Type": content_type}
    response = post_chat(server, headers)
    assert_refused(response, 415, "unsupported_media_type")
    # Sent in chunks, with no Content-Length, alike.
    chunked = loopback.post(
        server.base_url + "/v1/completions", content=iter([json.dumps(CHAT).encode()]), headers=headers, timeout=60
    )
    assert_refused(chunked, 415, "unsupported_media_type")


@pytest.mark.parametrize(
    "content_type", ["application/json; charset=utf-8", "Application/JSON", "application/vnd.api+json"]
)
def test_json_media_types_pass(server, content_type):
    response = post_chat(server, {"Content-Type": content_type})
    assert response.status_code == 200, response.text


def test_requests_without_a_body_need_no_content_type(server):
    response = loopback.delete(server.base_url + "/v1/responses/resp_nonexistent", timeout=30)
    assert response.status_code == 404, response.text
    assert loopback.get(server.base_url + "/v1/models", headers={"Content-Type": "text/plain"}).status_code == 200


# --- the policy's rules on their own ----------------------------------------------------


def test_policy_host_rules():
    default = OriginPolicy()
    assert default.host_allowed("evil.example", "10.0.0.5")  # reached over the network: any name
    assert default.host_allowed("evil.example", None)  # a Unix socket
    assert not default.host_allowed("evil.example", "127.0.0.1")
    assert not default.host_allowed("evil.example", "::1")
    assert not default.host_allowed("evil.example", "::ffff:127.0.0.1")
    assert default.host_allowed("localhost.:80", "127.0.0.1")
    assert default.host_allowed(None, "127.0.0.1")
    named = OriginPolicy.from_settings(["api.example", "box.example:8443"], [])
    assert named.host_allowed("API.example:1", "10.0.0.5") and named.host_allowed("box.example:8443", "127.0.0.1")
    assert not named.host_allowed("box.example:8444", "10.0.0.5")
    assert not named.host_allowed("localhost", "127.0.0.1")  # a list replaces the default
    assert OriginPolicy.from_settings(["*"], []).host_allowed("anything", "127.0.0.1")


def test_policy_origin_rules():
    policy = OriginPolicy.from_settings([], ["https://App.example/", "null"])
    assert policy.same_origin("https://box:8000", "box:8000") and policy.same_origin("http://box", "BOX")
    assert not policy.same_origin("http://box:8001", "box:8000") and not policy.same_origin("null", "box")
    assert policy.cross_origin_allowed("https://app.example") and policy.cross_origin_allowed("null")
    assert not policy.cross_origin_allowed("http://app.example")
    assert policy.refusal("/v1/models", "localhost", "https://other.example", "127.0.0.1").status == 403
    assert policy.refusal("/health", "evil", "https://other.example", "127.0.0.1") is None
    assert OriginPolicy.from_settings([], ["*"]).allow_origin_header("https://x.example") == "*"


def test_json_body_rules():
    assert body_refusal(None, "", 0, None) is None  # no body
    assert body_refusal("application/json", "application/json", 10, None) is None
    assert body_refusal("application/problem+json", "application/problem+json", 10, None) is None
    assert body_refusal(None, "", None, "chunked").status == 415
    assert body_refusal("text/json", "text/json", 10, None).status == 415


def test_settings_take_comma_separated_lists():
    settings = settings_from_env({"OVTRIO_ALLOWED_HOSTS": "a.example, b.example:81", "OVTRIO_ALLOWED_ORIGINS": "*"})
    assert settings.allowed_hosts == ["a.example", "b.example:81"] and settings.allowed_origins == ["*"]
    with pytest.raises(SettingsError, match="allowed_origins"):
        settings_from_env({}, allowed_origins=["app.example"])  # an origin has a scheme


# --- from a real browser ----------------------------------------------------------------

OPEN_SOCKET = """async ([url, create]) => await new Promise((resolve) => {
    const ws = new WebSocket(url);
    const done = (result) => { resolve(result); try { ws.close(); } catch (e) {} };
    ws.onopen = () => ws.send(create);
    ws.onmessage = (event) => done({opened: true, message: JSON.parse(event.data)});
    ws.onerror = () => done({opened: false});
    ws.onclose = (event) => done({opened: false, code: event.code});
    setTimeout(() => done({timeout: true}), 60000);
})"""

CORS_FETCH = """async ([url, body, type]) => {
    try {
        const response = await fetch(url, {method: "POST", headers: {"Content-Type": type}, body});
        return {status: response.status, body: await response.json()};
    } catch (error) {
        return {error: String(error)};
    }
}"""

# What a page can send without the server's leave: no-cors fetches with a text body or a
# Blob without a type (no Content-Type at all), and form posts into hidden frames.
SIMPLE_REQUESTS = """([url, body]) => {
    fetch(url, {method: "POST", mode: "no-cors", body});
    fetch(url, {method: "POST", mode: "no-cors", body: new Blob([body])});
    const form = (enctype, name, value, index) => {
        const frame = document.createElement("iframe");
        frame.name = "sink" + index;
        document.body.appendChild(frame);
        const element = document.createElement("form");
        element.method = "POST"; element.action = url; element.enctype = enctype; element.target = frame.name;
        const input = document.createElement("input");
        input.type = "hidden"; input.name = name; input.value = value;
        element.appendChild(input);
        document.body.appendChild(element);
        element.submit();
    };
    // text/plain sends "name=value": split at the last '=' of a JSON string, it is JSON.
    form("text/plain", body.slice(0, -2) + ', "x": "', '"}', 0);
    form("application/x-www-form-urlencoded", body, "", 1);
}"""


def ws_url(server: RunningServer) -> str:
    return server.base_url.replace("http://", "ws://") + "/v1/responses"


def create_frame() -> str:
    return json.dumps({"type": "response.create", "model": MODEL, "input": "Hi", "max_output_tokens": 2})


def chat_answers(server: RunningServer, status: str) -> float:
    try:
        return server.metric("ovtrio_http_responses_total", method="POST", route="/v1/chat/completions", status=status)
    except KeyError:
        return 0.0


@pytest.mark.browser
def test_page_of_another_origin_cannot_open_the_websocket(server, page, page_server):
    page.goto(page_server.url())
    result = page.evaluate(OPEN_SOCKET, [ws_url(server), create_frame()])
    assert result.get("opened") is False, result
    assert "message" not in result


@pytest.mark.browser
def test_page_of_another_origin_cannot_post_without_preflight(server, page, page_server):
    refused, answered = chat_answers(server, "403"), chat_answers(server, "200")
    page.goto(page_server.url())
    page.evaluate(SIMPLE_REQUESTS, [server.base_url + "/v1/chat/completions", json.dumps(CHAT)])
    deadline = time.monotonic() + 60
    while chat_answers(server, "403") < refused + 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert chat_answers(server, "403") == refused + 4
    assert chat_answers(server, "200") == answered


@pytest.mark.browser
def test_rebound_domain_cannot_read_the_server(server, page):
    # The page's own name now resolves to 127.0.0.1: it is same-origin with the server.
    response = page.goto(f"http://rebound.{REBOUND_DOMAIN}:{port_of(server)}/v1/models")
    assert response.status == 403
    assert json.loads(response.text())["error"]["code"] == "host_not_allowed"
    same_origin = server.base_url.replace("127.0.0.1", f"rebound.{REBOUND_DOMAIN}") + "/v1/chat/completions"
    result = page.evaluate(CORS_FETCH, [same_origin, json.dumps(CHAT), "application/json"])
    assert result.get("status") == 403, result


@pytest.mark.browser
def test_allowed_origin_may_use_cors_and_the_websocket(origin_server, page, page_server):
    url = origin_server.base_url + "/v1/chat/completions"
    page.goto(page_server.url())  # the allowed origin, http://127.0.0.1:PAGE_PORT
    result = page.evaluate(CORS_FETCH, [url, json.dumps(CHAT), "application/json"])
    assert result.get("status") == 200, result
    assert result["body"]["choices"][0]["message"]["role"] == "assistant"
    opened = page.evaluate(OPEN_SOCKET, [ws_url(origin_server), create_frame()])
    assert opened.get("opened") is True and opened["message"]["type"] == "response.created", opened

    page.goto(page_server.url(host="localhost"))  # same pages, another origin
    refused = page.evaluate(CORS_FETCH, [url, json.dumps(CHAT), "application/json"])
    assert "error" in refused, refused  # the browser withholds the answer
    assert page.evaluate(OPEN_SOCKET, [ws_url(origin_server), create_frame()]).get("opened") is False


@pytest.mark.browser
def test_any_origin_under_hypercorn_and_415_for_text(open_hypercorn, page, page_server):
    url = open_hypercorn.base_url + "/v1/chat/completions"
    page.goto(page_server.url(host="localhost"))
    result = page.evaluate(CORS_FETCH, [url, json.dumps(CHAT), "application/json"])
    assert result.get("status") == 200, result
    # Allowed to ask, but not with a body a form could send.
    text = page.evaluate(CORS_FETCH, [url, json.dumps(CHAT), "text/plain"])
    assert text.get("status") == 415 and text["body"]["error"]["code"] == "unsupported_media_type", text
