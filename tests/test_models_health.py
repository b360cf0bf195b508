"""GET /v1/models, /v3/models, /v1/models/{id}, the health probes and /metrics."""

from __future__ import annotations

import httpx
import pytest

import loopback
from helpers import complete
from openai_schema import validate
from sse import MODEL

EMBEDDER = "all-MiniLM-L6-v2"  # served beside the generation model by default


def get(server, path: str) -> httpx.Response:
    response = loopback.get(server.base_url + path, timeout=10)
    assert response.status_code == 200, response.text
    return response


@pytest.mark.parametrize("path", ["/v1/models", "/v3/models"])
def test_list_models(server, path):
    body = get(server, path).json()
    validate(body, "ListModelsResponse")
    # The generation model, then the embedded embedder (served beside it by default).
    assert [card["id"] for card in body["data"]] == [MODEL, EMBEDDER]
    assert all(card["object"] == "model" for card in body["data"])


@pytest.mark.parametrize("path", ["/v1/models/", "/v3/models/"])
def test_retrieve_model(server, path):
    card = get(server, path + MODEL).json()
    validate(card, "Model")
    assert card["id"] == MODEL
    assert card == get(server, "/v1/models").json()["data"][0]
    # SmolLM2's template has no tools: OpenVINO GenAI's polyfill teaches its reply format.
    assert card["chat_format"]["tool_calls"] == "json_tool_calls" and card["chat_format"]["reasoning"] is None
    assert "polyfill" in card["chat_format"]["chosen_by"]


def test_sdk_lists_and_retrieves_the_model(client):
    assert [model.id for model in client.models.list()] == [MODEL, EMBEDDER]
    assert client.models.retrieve(MODEL).id == MODEL
    assert client.models.retrieve(EMBEDDER).id == EMBEDDER


def test_liveness(server):
    assert get(server, "/health").json() == {"status": "ok"}


@pytest.mark.parametrize("path", ["/health/ready", "/ready"])
def test_readiness(server, path):
    body = get(server, path).json()
    assert body["status"] == "ready"
    assert body["model"] == MODEL


def test_metrics_exposition(server):
    response = get(server, "/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    for name, kind in [
        ("ovtrio_engine_requests", "gauge"),
        ("ovtrio_requests_running", "gauge"),
        ("ovtrio_generated_tokens_total", "counter"),
    ]:
        # (prometheus_client names a counter's family with or without "_total".)
        assert f"# TYPE {name} {kind}" in text or f"# TYPE {name.removesuffix('_total')} {kind}" in text
        # One series per served model, labelled with its name.
        assert any(line.startswith(f'{name}{{model_name="{MODEL}"}} ') for line in text.splitlines()), name


def test_metrics_idle_and_counting(server):
    assert server.metric("ovtrio_engine_requests") == 0
    assert server.metric("ovtrio_requests_running") == 0
    before = server.metric("ovtrio_generated_tokens_total")
    result = complete(server.base_url, max_tokens=7, temperature=0, ignore_eos=True)
    assert result.usage["completion_tokens"] == 7
    assert server.metric("ovtrio_generated_tokens_total") == before + 7
    assert server.metric("ovtrio_engine_requests") == 0
    assert server.metric("ovtrio_requests_running") == 0
