"""Several models behind one server, from a config file (--config): each answers under
its own name with its own settings, all are listed, each has its own readiness and its
own metrics series, and a model still loading (or failed) does not hold up the others.
Bad config files stop startup with one line.

The models are the embedded one under several names; nothing here depends on what the
model writes: requests force their length with max_tokens and ignore_eos.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import trio
from trio_websocket import open_websocket_url

import loopback
from conftest import READY_WITHIN, held_loading
from helpers import chat_body, post
from ovtrio.model import embedded_model_path
from ovtrio.settings.config_file import model_settings
from ovtrio.settings.server import Settings, SettingsError
from server_pool import server_fixture
from test_startup import assert_one_line_refusal, run_hypercorn, run_serve

EMBEDDED = str(embedded_model_path())
# small-b differs from small-a in its own settings: a lower max_tokens cap, and a KV cache
# of 64 blocks (2,048 tokens on CPU), less than the model's context.
SMALL_B_MAX_TOKENS = 4
MODELS: list[dict[str, Any]] = [
    {"served_model_name": "small-a", "model": EMBEDDED},
    {"served_model_name": "small-b", "model": EMBEDDED, "max_tokens_limit": SMALL_B_MAX_TOKENS, "num_kv_blocks": 64},
    # The same GGUF on the other backend: one request at a time through LLMPipeline.
    {"served_model_name": "small-stateful", "model": EMBEDDED, "backend": "stateful"},
]
# The tests below run over every entry (routing, listing, readiness, metrics): a model
# served another way (another backend) is one more line in MODELS.
NAMES = [entry["served_model_name"] for entry in MODELS]

models_server = server_fixture(
    "models_server", "--config", "{models.json}", files={"models.json": json.dumps({"models": MODELS})}
)


@pytest.fixture(scope="module")
def sdk(models_server):
    with openai.OpenAI(base_url=models_server.v1, api_key="unused", max_retries=0, timeout=120) as client:
        yield client


@pytest.mark.parametrize("name", NAMES)
def test_each_model_answers_under_its_own_name(sdk, name):
    chat = sdk.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=2, extra_body={"ignore_eos": True}
    )
    assert chat.model == name and chat.usage.completion_tokens == 2
    completion = sdk.completions.create(model=name, prompt="Hi", max_tokens=2, extra_body={"ignore_eos": True})
    assert completion.model == name and completion.usage.completion_tokens == 2
    response = sdk.responses.create(model=name, input="Hi", max_output_tokens=2, extra_body={"ignore_eos": True})
    assert response.model == name and response.usage.output_tokens == 2


def test_each_model_runs_on_its_own_backend(sdk):
    # Two choices in one request: the continuous-batching model runs them, the stateful
    # one (a single sequence at a time) refuses the field, in the same server.
    both = sdk.completions.create(model="small-a", prompt="Hi", n=2, max_tokens=2, extra_body={"ignore_eos": True})
    assert len(both.choices) == 2
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.completions.create(model="small-stateful", prompt="Hi", n=2, max_tokens=2)
    assert refused.value.body["param"] == "n"
    assert "stateful" in refused.value.body["message"]

    # Greedy output of the same prompt on each backend is its own; each repeats itself.
    def greedy(name: str) -> str:
        return (
            sdk.completions.create(model=name, prompt="Once upon a time", max_tokens=8, temperature=0).choices[0].text
        )

    assert greedy("small-stateful") == greedy("small-stateful")


def test_a_per_model_setting_applies_to_its_own_model_only(sdk):
    # small-b's max_tokens_limit is its default and its cap; small-a has neither.
    capped = sdk.completions.create(model="small-b", prompt="Hi", extra_body={"ignore_eos": True})
    assert capped.usage.completion_tokens == SMALL_B_MAX_TOKENS
    longer = SMALL_B_MAX_TOKENS + 4
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.completions.create(model="small-b", prompt="Hi", max_tokens=longer)
    assert refused.value.body["param"] == "max_tokens"
    free = sdk.completions.create(model="small-a", prompt="Hi", max_tokens=longer, extra_body={"ignore_eos": True})
    assert free.usage.completion_tokens == longer


def test_each_model_has_its_own_tokenizer_limits(models_server):
    # small-b's KV cache holds fewer tokens than the model's context, which then limits it.
    lengths = {
        name: post(models_server.base_url, "/tokenize", {"model": name, "prompt": "Hi"}).json()["max_model_len"]
        for name in NAMES
    }
    assert lengths["small-b"] < lengths["small-a"]


def test_every_model_is_listed(sdk):
    assert [model.id for model in sdk.models.list()] == [*NAMES, "all-MiniLM-L6-v2"]  # and the embedded embedder
    for name in NAMES:
        assert sdk.models.retrieve(name).id == name


def test_an_unknown_model_is_a_404_naming_it(sdk, models_server):
    with pytest.raises(openai.NotFoundError) as refused:
        sdk.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert refused.value.body["code"] == "model_not_found" and "'no-such-model'" in refused.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        sdk.models.retrieve("no-such-model")
    reply = post(models_server.base_url, "/tokenize", {"model": "no-such-model", "prompt": "Hi"})
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "model_not_found"


async def test_the_websocket_routes_each_response_by_its_model(models_server):
    url = models_server.base_url.replace("http://", "ws://") + "/v1/responses"

    def create(model: str, stream_id: str) -> str:
        return json.dumps(
            {
                "type": "response.create",
                "model": model,
                "input": "Hi",
                "max_output_tokens": 2,
                "ignore_eos": True,
                "stream_id": stream_id,
            }
        )

    finals: dict[str, dict[str, Any]] = {}
    errors: dict[str, dict[str, Any]] = {}
    with trio.fail_after(60):
        async with open_websocket_url(url) as ws:
            for name in NAMES:
                await ws.send_message(create(name, name))
            await ws.send_message(create("no-such-model", "unknown"))
            while len(finals) < len(NAMES) or not errors:
                event = json.loads(await ws.get_message())
                if event["type"] == "error":
                    errors[event["stream_id"]] = event
                elif event["type"] in ("response.completed", "response.incomplete"):
                    finals[event["stream_id"]] = event["response"]
    assert {stream: response["model"] for stream, response in finals.items()} == {name: name for name in NAMES}
    assert errors["unknown"]["code"] == "model_not_found" and "'no-such-model'" in errors["unknown"]["message"]


def test_readiness_of_the_server_and_of_each_model(models_server):
    for path in ("/health/ready", "/ready", "/v2/health/ready"):
        reply = loopback.get(models_server.base_url + path, timeout=10)
        assert reply.status_code == 200, reply.text
        assert reply.json()["models"] == [{"id": name, "status": "ready"} for name in NAMES]
    for name in NAMES:
        reply = loopback.get(f"{models_server.base_url}/v2/models/{name}/ready", timeout=10)
        assert reply.status_code == 200 and reply.json() == {"id": name, "status": "ready"}
    unknown = loopback.get(models_server.base_url + "/v2/models/no-such-model/ready", timeout=10)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    config = loopback.get(models_server.base_url + "/v1/config", timeout=10).json()
    assert {name: status["model_version_status"][0]["state"] for name, status in config.items()} == dict.fromkeys(
        NAMES, "AVAILABLE"
    )


def test_requests_to_one_model_move_only_its_metrics(models_server):
    def generated(name: str) -> dict[str, float]:
        return {
            "vllm": models_server.metric("vllm:generation_tokens_total", model_name=name),
            "ovtrio": models_server.metric("ovtrio_generated_tokens_total", model_name=name),
            "finished": models_server.metric("vllm:request_success_total", model_name=name, finished_reason="length"),
            "histogram": models_server.metric("vllm:request_generation_tokens_sum", model_name=name),
        }

    for name in NAMES:
        before = {other: generated(other) for other in NAMES}
        post(
            models_server.base_url,
            "/v1/completions",
            {"model": name, "prompt": "Hi", "max_tokens": 3, "ignore_eos": True},
        )
        after = {other: generated(other) for other in NAMES}
        for other in NAMES:
            rose = {key: after[other][key] - before[other][key] for key in before[other]}
            expected = (
                {"vllm": 3, "ovtrio": 3, "finished": 1, "histogram": 3} if other == name else dict.fromkeys(rose, 0)
            )
            assert rose == expected, (name, other)
    # The gauges have one series per model too.
    for name in NAMES:
        assert models_server.metric("vllm:num_requests_running", model_name=name, engine="0") == 0
        assert models_server.metric("ovtrio_requests_running", model_name=name) == 0


def test_one_model_serves_while_another_loads_and_a_failed_one_is_reported(tmp_path):
    """small-a loads first and serves; broken fails while loading (an IR folder whose
    model file the engine cannot read, which passes the checks made before loading);
    held waits for its chat template, a pipe the test writes (conftest.held_loading).
    small-a and broken name a template file of their own: a load reads its template
    first."""
    template = Path(__file__).parent / "data" / "plain_template.jinja"
    config = tmp_path / "models.json"
    damaged = tmp_path / "damaged-ir"
    damaged.mkdir()
    (damaged / "openvino_model.xml").write_text("<net>not a model</net>")
    config.write_text(
        json.dumps(
            {
                "models": [
                    {"served_model_name": "small-a", "model": EMBEDDED, "chat_template": str(template)},
                    {"served_model_name": "broken", "model": str(damaged), "chat_template": str(template)},
                    {"served_model_name": "held", "model": EMBEDDED},
                ]
            }
        )
    )
    with held_loading(tmp_path, "--config", str(config)) as loading:
        base = loading.base_url

        def ready(name: str) -> httpx.Response:
            return loopback.get(f"{base}/v2/models/{name}/ready", timeout=10)

        deadline = time.monotonic() + READY_WITHIN  # a cap for a hang
        while ready("small-a").status_code != 200 or ready("broken").json()["status"] != "failed":
            assert loading.process.poll() is None, "the server exited while small-a loaded"
            assert time.monotonic() < deadline, f"small-a still loading after {READY_WITHIN} s (a hang)"
            time.sleep(0.1)
        held = ready("held")
        assert held.status_code == 503 and held.json()["status"] == "loading"
        broken = ready("broken")
        assert broken.status_code == 503 and "damaged-ir" in broken.json()["reason"]
        server = loopback.get(base + "/health/ready", timeout=10)
        assert server.status_code == 503
        assert [model["status"] for model in server.json()["models"]] == ["ready", "failed", "loading"]
        assert loopback.get(base + "/health", timeout=10).status_code == 200  # alive: one model serves
        states = loopback.get(base + "/v1/config", timeout=10).json()
        assert {name: status["model_version_status"][0]["state"] for name, status in states.items()} == {
            "small-a": "AVAILABLE",
            "broken": "END",
            "held": "LOADING",
        }
        assert "damaged-ir" in states["broken"]["model_version_status"][0]["status"]["error_message"]

        serving = post(base, "/v1/chat/completions", chat_body(model="small-a", max_tokens=2))
        assert serving.status_code == 200 and serving.json()["model"] == "small-a"
        waiting = post(base, "/v1/chat/completions", chat_body(model="held", max_tokens=2))
        assert waiting.status_code == 503 and waiting.json()["error"]["code"] == "model_loading"
        failed = post(base, "/v1/chat/completions", chat_body(model="broken", max_tokens=2))
        assert failed.status_code == 503 and failed.json()["error"]["code"] == "model_unavailable"

        loading.release(template.read_text())
        while ready("held").status_code != 200:
            assert loading.process.poll() is None, "the server exited while held loaded"
            assert time.monotonic() < deadline, f"held still loading after {READY_WITHIN} s (a hang)"
            time.sleep(0.1)
        later = post(base, "/v1/chat/completions", chat_body(model="held", max_tokens=2))
        assert later.status_code == 200 and later.json()["model"] == "held"


# A config file's problems, each refused in one line naming the file, the entry and the key.


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("config", "fragments"),
    [
        (
            {"models": [{"served_model_name": "a"}, {"served_model_name": "b", "port": 9000}]},
            ["models[1] ('b')", "port is a server-wide setting", "--port"],
        ),
        ({"models": [{"served_model_name": "a", "max_tokens_limit": 0}]}, ["models[0] ('a')", "max_tokens_limit"]),
        ({"models": [{"served_model_name": "a", "max_num_seqs": "lots"}]}, ["models[0] ('a')", "max_num_seqs"]),
        ({"models": [{"served_model_name": "a", "colour": "blue"}]}, ["models[0] ('a')", "unknown key 'colour'"]),
        ({"models": [{"served_model_name": "a"}, {"device": "CPU"}]}, ["models[1]", "served_model_name is required"]),
        (
            {"models": [{"served_model_name": "a"}, {"served_model_name": "a"}]},
            ["models[1] ('a')", "served_model_name 'a'"],
        ),
        ({"models": []}, ["models"]),
        ({"model": "x.gguf"}, ["model"]),
    ],
)
def test_a_bad_config_file_is_refused_in_one_line(tmp_path, config, fragments):
    path = write(tmp_path, "models.json", json.dumps(config))
    assert_one_line_refusal(run_serve("--config", str(path)), "invalid config file", str(path), *fragments)


def test_a_bad_toml_config_file_is_refused_in_one_line(tmp_path):
    path = write(tmp_path, "models.toml", '[[models]]\nserved_model_name = "a"\nkv_cache_precision = "f64"\n')
    assert_one_line_refusal(run_serve("--config", str(path)), str(path), "models[0] ('a')", "kv_cache_precision")
    broken = write(tmp_path, "broken.toml", "[[models]\n")
    assert_one_line_refusal(run_serve("--config", str(broken)), str(broken), "not valid TOML")


def test_a_missing_config_file_and_a_missing_model_are_refused_in_one_line(tmp_path):
    missing = tmp_path / "nowhere.json"
    assert_one_line_refusal(run_serve("--config", str(missing)), str(missing), "No such file")
    # A relative model path is relative to the config file's folder.
    folder = tmp_path / "configs"
    folder.mkdir()
    path = write(folder, "models.json", json.dumps({"models": [{"served_model_name": "a", "model": "gone.gguf"}]}))
    assert_one_line_refusal(run_serve("--config", str(path)), str(folder / "gone.gguf"), "no such file")


def test_entries_override_the_command_line_which_is_every_models_default(tmp_path):
    json_file = write(
        tmp_path,
        "models.json",
        json.dumps(
            {
                "models": [
                    {"served_model_name": "a", "model": "a.gguf", "device": "GPU"},
                    {
                        "served_model_name": "b",
                        "model": "/models/b",
                        "chat_template": "b.jinja",
                        "enable_prefix_caching": True,
                    },
                ]
            }
        ),
    )
    toml_file = write(
        tmp_path,
        "models.toml",
        """
[[models]]
served_model_name = "a"
model = "a.gguf"
device = "GPU"

[[models]]
served_model_name = "b"
model = "/models/b"
chat_template = "b.jinja"
enable_prefix_caching = true
""",
    )
    defaults = {"max_tokens_limit": 64, "enable_prefix_caching": False, "port": 9000}
    from_json = model_settings(Settings(config=str(json_file), **defaults))
    assert model_settings(Settings(config=str(toml_file), **defaults)) == [
        settings.model_copy(update={"config": str(toml_file)}) for settings in from_json
    ]
    a, b = from_json
    assert (a.device, b.device) == ("GPU", "CPU")
    assert (a.enable_prefix_caching, b.enable_prefix_caching) == (False, True)
    assert a.max_tokens_limit == b.max_tokens_limit == 64 and a.port == b.port == 9000
    assert a.model == str(tmp_path / "a.gguf") and b.model == "/models/b"
    assert b.chat_template == str(tmp_path / "b.jinja")
    with pytest.raises(SettingsError):
        model_settings(Settings(config=str(tmp_path / "missing.json")))
    assert model_settings(Settings(max_tokens_limit=5)) == [Settings(max_tokens_limit=5)]


def test_hypercorn_reads_the_config_file_from_the_environment(tmp_path):
    path = write(tmp_path, "models.json", json.dumps({"models": [{"served_model_name": "a", "api_key": ["k"]}]}))
    output = run_hypercorn({"OVTRIO_CONFIG": str(path)})
    assert "Traceback" not in output
    refusals = [line for line in output.splitlines() if "invalid config file" in line]
    assert len(refusals) == 1 and "api_key is a server-wide setting" in refusals[0], output
