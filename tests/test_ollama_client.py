"""Ollama's API driven by the official `ollama` Python client, unmodified, against real
servers: chat and generate, unary and streamed (compared: the same greedy request on a
server proven exact), `format` with a pydantic model's schema, a tool call round trip,
`think`, images on the vision fixture, embed, list, ps, show and version. Every body
and stream record the client receives is checked against Ollama's Go types as it
arrives (ollama_schema.CheckingTransport).

Nothing here asserts what the model writes: behaviour is forced through the API
(num_predict, format schemas, options.tool_choice) and streams are compared with unary
replies.
"""

from __future__ import annotations

import io
import json
import math
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np
import ollama
import pytest
from PIL import Image
from pydantic import BaseModel, Field

import loopback
import ollama_schema
import tiny_vlm
from conftest import MODEL
from ollama_schema import CheckingTransport
from test_images import MODEL as VLM
from test_images import vlm_server  # noqa: F401 (the vision fixture's server, shared with test_images.py)
from test_messages import thinking_server  # noqa: F401 (the thinking template's server)

EMBEDDER = "all-MiniLM-L6-v2"
GREEDY = {"temperature": 0, "num_predict": 16}
STORY = [{"role": "user", "content": "Tell me a short story about a lighthouse keeper."}]
IS_IT = [{"role": "user", "content": "Is the sky blue? Answer true or false."}]
BOOLEAN = {"type": "boolean"}


class Weather(BaseModel):
    city: str = Field(max_length=20)
    sky: Literal["sunny", "cloudy", "rainy"]


def get_weather(city: str) -> str:
    """The current weather of a city.

    Args:
      city: The city's name.
    """
    return "sunny"


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name.", "maxLength": 20}},
            "required": ["city"],
        },
    },
}


def client_of(server: Any) -> ollama.Client:
    return ollama.Client(host=server.base_url, timeout=120, transport=CheckingTransport())


@pytest.fixture(scope="module")
def client(server):
    return client_of(server)


def checked(client: ollama.Client) -> list[str]:
    transport = client._client._transport
    assert isinstance(transport, CheckingTransport)
    return transport.checked


def check_measures(final: Any, num_predict: int | None = None) -> None:
    """The final record's measures: present, positive, and consistent with each other."""
    assert final.done is True and final.done_reason in ("stop", "length")
    assert final.prompt_eval_count > 0 and final.eval_count > 0
    assert final.total_duration > 0 and final.prompt_eval_duration > 0
    assert final.load_duration is None or final.load_duration < final.total_duration
    if final.eval_count >= 2:
        assert final.eval_duration > 0
    # The prefill and the decoding are parts of the request's time.
    assert (final.prompt_eval_duration or 0) + (final.eval_duration or 0) <= final.total_duration
    if num_predict is not None and final.done_reason == "length":
        assert final.eval_count == num_predict
    if num_predict is not None:
        assert final.eval_count <= num_predict


# ---- chat and generate ------------------------------------------------------------------


def test_chat_streamed_matches_unary(client):
    before = len(checked(client))
    unary = client.chat(model=MODEL, messages=STORY, options=GREEDY)
    assert unary.message.role == "assistant" and unary.message.content
    check_measures(unary, 16)
    parts = list(client.chat(model=MODEL, messages=STORY, options=GREEDY, stream=True))
    assert [part.done for part in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(part.message.content for part in parts) == unary.message.content
    final = parts[-1]
    check_measures(final, 16)
    assert (final.done_reason, final.eval_count, final.prompt_eval_count) == (
        unary.done_reason,
        unary.eval_count,
        unary.prompt_eval_count,
    )
    assert len(checked(client)) - before == 1 + len(parts)


def test_generate_streamed_matches_unary(client):
    prompt = "The capital of France is"
    unary = client.generate(model=MODEL, prompt=prompt, options=GREEDY)
    assert unary.response
    check_measures(unary, 16)
    parts = list(client.generate(model=MODEL, prompt=prompt, options=GREEDY, stream=True))
    assert "".join(part.response for part in parts) == unary.response
    assert parts[-1].eval_count == unary.eval_count and parts[-1].done_reason == unary.done_reason
    # system comes before the prompt (in place of the template's default one, shorter
    # than this); raw leaves the template out.
    with_system = client.generate(model=MODEL, prompt=prompt, system="Be brief. " * 40, options=GREEDY)
    raw = client.generate(model=MODEL, prompt=prompt, raw=True, options=GREEDY)
    assert with_system.prompt_eval_count > unary.prompt_eval_count > raw.prompt_eval_count


def test_num_predict_bounds_the_reply_and_eval_count_counts_it(client):
    long = [{"role": "user", "content": "Count from 1 to 500, one number per line."}]
    endless = {"type": "string", "minLength": 400, "maxLength": 400}  # only num_predict can end it
    for limit in (1, 2, 7):
        reply = client.chat(model=MODEL, messages=long, format=endless, options={"num_predict": limit})
        assert reply.done_reason == "length" and reply.eval_count == limit
        check_measures(reply, limit)


def test_a_trailing_assistant_message_is_continued(client, server):
    prefill = [*STORY, {"role": "assistant", "content": "Once upon a time"}]
    answered = client.chat(model=MODEL, messages=STORY, options={"num_predict": 2})
    continued = client.chat(model=MODEL, messages=prefill, options={"num_predict": 2})
    assert continued.prompt_eval_count > answered.prompt_eval_count
    # The same prompt the Messages API continues the same conversation from.
    counted = loopback.post(
        server.base_url + "/v1/messages/count_tokens", json={"model": MODEL, "messages": prefill}, timeout=60
    ).json()["input_tokens"]
    assert continued.prompt_eval_count == counted


def test_logprobs_cover_every_generated_token(client, server):
    options = {"temperature": 0, "num_predict": 10}
    unary = client.chat(model=MODEL, messages=STORY, options=options, logprobs=True)
    entries = unary.logprobs
    assert entries is not None and len(entries) == unary.eval_count
    assert "".join(entry.token for entry in entries) == unary.message.content
    assert all(entry.logprob <= 0 for entry in entries)
    parts = list(client.chat(model=MODEL, messages=STORY, options=options, logprobs=True, stream=True))
    streamed = [entry for part in parts for entry in part.logprobs or []]
    assert [e.token for e in streamed] == [e.token for e in entries]
    # The bytes (which this client does not read) join to the text too.
    raw = loopback.post(
        server.base_url + "/api/chat",
        json={"model": MODEL, "messages": STORY, "options": options, "logprobs": True, "stream": False},
        timeout=120,
    ).json()
    ollama_schema.check_record("/api/chat", raw)
    assert b"".join(bytes(entry["bytes"]) for entry in raw["logprobs"]).decode() == unary.message.content
    assert client.chat(model=MODEL, messages=STORY, options=options).logprobs is None
    generated = client.generate(model=MODEL, prompt="The capital of France is", options=options, logprobs=True)
    assert generated.logprobs is not None and len(generated.logprobs) == generated.eval_count
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model=MODEL, messages=STORY, logprobs=True, top_logprobs=3)
    assert refused.value.status_code == 400 and "'top_logprobs'" in refused.value.error


def test_model_names_with_and_without_latest(client):
    plain = client.chat(model=MODEL, messages=STORY, options={"num_predict": 4, "temperature": 0})
    tagged = client.chat(model=MODEL + ":latest", messages=STORY, options={"num_predict": 4, "temperature": 0})
    assert tagged.model == MODEL + ":latest" and plain.model == MODEL
    assert plain.message.content == tagged.message.content
    with pytest.raises(ollama.ResponseError) as missing:
        client.chat(model=MODEL + ":7b", messages=STORY)
    assert missing.value.status_code == 404 and MODEL in missing.value.error


def test_format_with_a_pydantic_models_schema(client):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    reply = client.chat(
        model=MODEL,
        messages=messages,
        format=Weather.model_json_schema(),
        options={"temperature": 0, "num_predict": 80},
    )
    assert reply.done_reason == "stop"
    Weather.model_validate_json(reply.message.content)
    streamed = client.chat(
        model=MODEL,
        messages=messages,
        format=Weather.model_json_schema(),
        options={"temperature": 0, "num_predict": 80},
        stream=True,
    )
    assert "".join(part.message.content for part in streamed) == reply.message.content
    generated = client.generate(model=MODEL, prompt="Is the sky blue?", format=BOOLEAN, options={"num_predict": 20})
    assert generated.done_reason == "stop" and isinstance(json.loads(generated.response), bool)
    as_json = client.generate(model=MODEL, prompt="Describe Paris.", format="json", options={"num_predict": 200})
    if as_json.done_reason == "stop":  # a JSON object that ended: one
        assert isinstance(json.loads(as_json.response), dict)


def test_a_tool_call_round_trip(client):
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    forced = {"tool_choice": "required", "num_predict": 120, "temperature": 0}
    reply = client.chat(model=MODEL, messages=messages, tools=[get_weather], options=forced)
    calls = reply.message.tool_calls
    assert calls and calls[0].function.name == "get_weather"
    arguments = calls[0].function.arguments
    assert isinstance(arguments, dict) and isinstance(arguments["city"], str)  # an object, not JSON text
    assert reply.done_reason == "stop"
    streamed = list(client.chat(model=MODEL, messages=messages, tools=[WEATHER_TOOL], options=forced, stream=True))
    streamed_calls = [call for part in streamed for call in part.message.tool_calls or []]
    assert [(c.function.name, c.function.arguments) for c in streamed_calls] == [
        (c.function.name, c.function.arguments) for c in calls
    ]
    # The call and its result go back; the model answers from them.
    messages += [reply.message, {"role": "tool", "content": get_weather(**arguments), "tool_name": "get_weather"}]
    answer = client.chat(model=MODEL, messages=messages, tools=[get_weather], options={"num_predict": 8})
    assert answer.done and answer.prompt_eval_count > reply.prompt_eval_count
    # A call named by options.tool_choice is the one made.
    named = client.chat(
        model=MODEL, messages=messages[:1], tools=[WEATHER_TOOL], options={**forced, "tool_choice": "get_weather"}
    )
    assert [c.function.name for c in named.message.tool_calls] == ["get_weather"]


# ---- think --------------------------------------------------------------------------------


def test_think_comes_back_as_thinking(thinking_server):
    client = client_of(thinking_server)
    options = {"temperature": 0, "num_predict": 1100}
    thought = client.chat(model=MODEL, messages=IS_IT, format=BOOLEAN, think=True, options=options)
    off = client.chat(model=MODEL, messages=IS_IT, format=BOOLEAN, think=False, options=options)
    # The template opened <think> and the reply never closes it: all of it is thinking.
    assert thought.message.thinking in ("true", "false") and thought.message.content == ""
    assert off.message.thinking is None and off.message.content in ("true", "false")
    assert thought.prompt_eval_count > off.prompt_eval_count
    streamed = list(
        client.chat(model=MODEL, messages=IS_IT, format=BOOLEAN, think="high", options=options, stream=True)
    )
    assert "".join(part.message.thinking or "" for part in streamed) == thought.message.thinking
    generated = client.generate(model=MODEL, prompt=IS_IT[0]["content"], format=BOOLEAN, think=True, options=options)
    assert generated.thinking in ("true", "false") and generated.response == ""
    assert "thinking" in client.show(MODEL).capabilities


def test_think_on_a_model_that_does_not_is_refused(client):
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model=MODEL, messages=IS_IT, think=True)
    assert refused.value.status_code == 400 and "'think'" in refused.value.error
    assert "thinking" not in client.show(MODEL).capabilities
    # Ollama's CLI learns it from the preload it sends (an empty prompt, with think).
    with pytest.raises(ollama.ResponseError) as preload:
        client.generate(model=MODEL, prompt="", think=True)
    assert preload.value.status_code == 400 and "'think'" in preload.value.error
    assert client.generate(model=MODEL, prompt="", think=False).done_reason == "load"


# ---- images -------------------------------------------------------------------------------


def png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (40, 60, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def test_images_on_the_vision_model(vlm_server):
    client = client_of(vlm_server)
    text = [{"role": "user", "content": "Describe this image."}]
    plain = client.chat(model=VLM, messages=text, options={"num_predict": 2})
    seen = client.chat(model=VLM, messages=[{**text[0], "images": [png(1)]}], options={"num_predict": 2})
    assert seen.prompt_eval_count >= plain.prompt_eval_count + tiny_vlm.IMAGE_TOKENS
    two = client.generate(model=VLM, prompt="Compare them.", images=[png(2), png(3)], options={"num_predict": 2})
    assert two.prompt_eval_count >= 2 * tiny_vlm.IMAGE_TOKENS
    assert "vision" in client.show(VLM).capabilities
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model=VLM, messages=[{**text[0], "images": ["bm90IGFuIGltYWdl"]}])  # "not an image"
    assert refused.value.status_code == 400 and "messages[0].images[0]" in refused.value.error


def test_images_on_a_text_model_are_refused(client):
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model=MODEL, messages=[{"role": "user", "content": "Hi", "images": [png(1)]}])
    assert refused.value.status_code == 400 and "messages[0].images[0]" in refused.value.error
    assert "vision" not in client.show(MODEL).capabilities


# ---- embeddings ---------------------------------------------------------------------------


def test_embed_and_embeddings(client):
    two = client.embed(model=EMBEDDER, input=["The sky is blue.", "Grass is green."])
    assert len(two.embeddings) == 2 and len(two.embeddings[0]) == len(two.embeddings[1]) > 0
    for vector in two.embeddings:
        assert math.isclose(float(np.linalg.norm(vector)), 1.0, rel_tol=1e-4)
    assert two.prompt_eval_count > 0 and two.total_duration > 0
    one = client.embed(model=EMBEDDER + ":latest", input="The sky is blue.")
    assert np.allclose(one.embeddings[0], two.embeddings[0], atol=1e-5)
    # The older route: one vector, as the model gives it (not scaled to unit length).
    older = client.embeddings(model=EMBEDDER, prompt="The sky is blue.")
    direction = np.asarray(older.embedding) / np.linalg.norm(older.embedding)
    assert np.allclose(direction, one.embeddings[0], atol=1e-5)
    assert client.embed(model=EMBEDDER, input=[]).embeddings == []
    assert client.embeddings(model=EMBEDDER, prompt="").embedding == []
    with pytest.raises(ollama.ResponseError) as refused:
        client.embed(model=EMBEDDER, input="x", dimensions=8)
    assert refused.value.status_code == 400 and "'dimensions'" in refused.value.error
    with pytest.raises(ollama.ResponseError) as wrong_kind:
        client.embed(model=MODEL, input="x")
    assert wrong_kind.value.status_code == 400


# ---- the catalog --------------------------------------------------------------------------


def test_list_ps_show_and_version(client):
    listed = {model.model: model for model in client.list().models}
    assert {MODEL + ":latest", EMBEDDER + ":latest"} <= set(listed)
    generation = listed[MODEL + ":latest"]
    assert listed[EMBEDDER + ":latest"].size > 0 and listed[EMBEDDER + ":latest"].details.family
    assert generation.size > 0 and len(generation.digest) == 64 and generation.details.format in ("gguf", "openvino")
    client.chat(model=MODEL, messages=STORY, options={"num_predict": 1}, keep_alive="7m")
    running = {model.model: model for model in client.ps().models}
    assert MODEL + ":latest" in running and running[MODEL + ":latest"].size_vram == 0
    expires = running[MODEL + ":latest"].expires_at
    assert expires is not None and expires.tzinfo is not None
    ahead = (expires - datetime.now(UTC)).total_seconds()
    assert 5 * 60 < ahead <= 7 * 60  # the request's keep_alive, from its end
    shown = client.show(MODEL + ":latest")
    architecture = shown.modelinfo["general.architecture"]
    assert architecture == generation.details.family and architecture
    assert shown.modelinfo[f"{architecture}.context_length"] > 0
    assert "completion" in shown.capabilities and "embedding" not in shown.capabilities
    assert shown.template  # the model's chat template (it is loaded)
    assert client.show(EMBEDDER).capabilities == ["embedding"]
    with pytest.raises(ollama.ResponseError) as missing:
        client.show("no-such-model")
    assert missing.value.status_code == 404
    version = client._client.get("/api/version").json()["version"]
    assert [int(part) for part in version.split(".")] >= [0, 9, 0]  # `think` and tool calls in streams
    assert {"/api/tags", "/api/ps", "/api/show", "/api/version"} <= set(checked(client))


def test_management_routes_say_models_come_from_the_folder(client):
    for call in (
        lambda: client.pull(MODEL),
        lambda: client.push(MODEL),
        lambda: client.create(model="copy", from_=MODEL),
        lambda: client.copy(MODEL, "copy"),
        lambda: client.delete(MODEL),
    ):
        with pytest.raises(ollama.ResponseError) as refused:
            call()
        assert refused.value.status_code == 400 and "models folder" in refused.value.error
    assert MODEL + ":latest" in {model.model for model in client.list().models}


async def test_the_async_client_as_home_assistant_uses_it(server):
    """Home Assistant's integration drives ollama.AsyncClient: list, then a streamed chat
    with tools, keep_alive -1 and num_ctx in options."""
    client = ollama.AsyncClient(host=server.base_url, timeout=120)
    models = (await client.list()).models
    assert MODEL + ":latest" in {model.model for model in models}
    parts = [
        part
        async for part in await client.chat(
            model=MODEL + ":latest",
            messages=STORY,
            tools=[WEATHER_TOOL],
            stream=True,
            keep_alive=-1,
            options={"num_ctx": 8192, "num_predict": 6, "temperature": 0},
        )
    ]
    assert parts[-1].done and 0 < parts[-1].eval_count <= 6
    for part in parts:
        ollama_schema.check_record("/api/chat", part.model_dump(exclude_none=True))
