"""Stored responses and chaining: retrieve, delete, input_items, previous_response_id,
and the store's bounds."""

from __future__ import annotations

import openai
import pytest

import loopback
from helpers import post
from in_process import in_process_server, serving_in_process
from openai_schema import validate

MODEL = "SmolLM2-135M-Instruct"


def ask(client, **fields):
    return client.responses.create(model=MODEL, max_output_tokens=12, temperature=0, **fields)


def test_retrieve_and_input_items(client, server):
    first = ask(client, input=[{"role": "user", "content": "My name is Ada."}])
    again = client.responses.retrieve(first.id)
    assert again.id == first.id and again.output_text == first.output_text
    raw = loopback.get(f"{server.base_url}/v3/responses/{first.id}").json()
    validate(raw, "Response")
    items = client.responses.input_items.list(first.id)
    assert [item.type for item in items.data] == ["message"]


def test_input_items_are_listed_as_openais_item_resources(client, server):
    """Whatever spelling the request used (a string, chat-style `text` parts, an
    assistant turn, a function call and its output), the listing gives OpenAI's items:
    content as typed parts and a status on every item."""
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in "}, {"type": "text", "text": "Paris"}]},
        {"role": "assistant", "content": "Let me look."},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"role": "user", "content": "Thanks."},
    ]
    first = ask(client, input=history)
    raw = loopback.get(f"{server.base_url}/v1/responses/{first.id}/input_items?order=asc").json()
    validate(raw, "ResponseItemList")
    items = client.responses.input_items.list(first.id, order="asc").data
    assert [item.type for item in items] == ["message"] * 3 + ["function_call", "function_call_output", "message"]
    assert all(item.status == "completed" for item in items)
    system, user, assistant, call, output, thanks = items
    assert [(part.type, part.text) for part in system.content] == [("input_text", "Be brief.")]
    assert [(part.type, part.text) for part in user.content] == [("input_text", "Weather in "), ("input_text", "Paris")]
    assert [(part.type, part.text) for part in assistant.content] == [("output_text", "Let me look.")]
    assert (call.call_id, call.name, call.arguments) == ("call_1", "get_weather", '{"city": "Paris"}')
    assert (output.call_id, output.output) == ("call_1", "sunny")
    assert [(part.type, part.text) for part in thanks.content] == [("input_text", "Thanks.")]


def test_previous_response_id_continues_the_conversation(client):
    first = ask(client, input="My name is Ada. Remember it.")
    second = ask(client, input="What is my name?", previous_response_id=first.id)
    alone = ask(client, input="What is my name?")
    assert second.previous_response_id == first.id
    # The earlier turn (its input and output) is part of the prompt.
    assert second.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens


def test_chaining_a_streamed_response(client):
    with client.responses.stream(model=MODEL, input="Say hello.", max_output_tokens=60, temperature=0) as stream:
        final = stream.get_final_response()
    follow = ask(client, input="Again?", previous_response_id=final.id)
    assert client.responses.retrieve(final.id).output_text == final.output_text
    assert follow.usage.input_tokens > 20


def test_store_false_is_not_kept(client):
    reply = ask(client, input="Hi", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(reply.id)
    with pytest.raises(openai.NotFoundError):
        ask(client, input="Hi", previous_response_id=reply.id)


def test_delete(client):
    reply = ask(client, input="Hi")
    deleted = loopback.delete(f"{client.base_url}responses/{reply.id}").json()
    assert deleted == {"id": reply.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(reply.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(reply.id)


def test_unknown_previous_response_is_a_404_naming_it(server):
    reply = post(server.base_url, "/v1/responses", {"model": MODEL, "input": "x", "previous_response_id": "resp_nope"})
    assert reply.status_code == 404
    assert reply.json()["error"]["param"] == "previous_response_id"


STORE_FILE = "responses.sqlite"  # in the server's folder
# The store's bounds are the HTTP layer's: in process, over a fake engine.
small_store_server = in_process_server(
    "small_store_server", "--response-store-size", "2", "--response-store-path", "{folder}/" + STORE_FILE
)


def test_the_store_keeps_only_the_newest(small_store_server):
    with openai.OpenAI(base_url=small_store_server.v1, api_key="unused", max_retries=0) as sdk:
        ids = [ask(sdk, input=f"Hi {i}").id for i in range(3)]
        with pytest.raises(openai.NotFoundError):
            sdk.responses.retrieve(ids[0])
        assert [sdk.responses.retrieve(i).id for i in ids[1:]] == ids[1:]


async def test_store_expires_by_age():
    """Pure logic: entries older than the age limit are gone."""
    from ovtrio.api.responses.store import ResponseStore, StoredResponse

    store = ResponseStore(max_entries=10, max_age_seconds=60)
    old = StoredResponse({"id": "resp_old"}, [], [], stored_at=1.0)
    await store.put(old)
    await store.put(StoredResponse({"id": "resp_new"}, [], []))
    assert await store.get("resp_old") is None and await store.get("resp_new") is not None


async def test_sqlite_store_answers_from_the_file(tmp_path):
    """Pure logic: the file holds what memory no longer does, and deletes reach it."""
    from ovtrio.api.responses.store import ResponseStore, StoredResponse

    path = str(tmp_path / "responses.sqlite")
    first = ResponseStore(max_entries=10, max_age_seconds=60, path=path)
    await first.put(StoredResponse({"id": "resp_kept"}, [], [{"role": "user", "content": "Hi"}]))
    second = ResponseStore(max_entries=10, max_age_seconds=60, path=path)
    kept = await second.get("resp_kept")
    assert kept is not None and kept.conversation == [{"role": "user", "content": "Hi"}]
    assert await second.delete("resp_kept")
    third = ResponseStore(max_entries=10, max_age_seconds=60, path=path)
    assert await third.get("resp_kept") is None


def test_sqlite_store_survives_a_restart(tmp_path):
    """A server stopped (its lifespan ended) leaves the file, and a real server started
    on it answers for what the first stored, chains on it, and deletes it."""
    from conftest import running_server

    store = str(tmp_path / STORE_FILE)
    with serving_in_process("--response-store-path", store) as first:
        with openai.OpenAI(base_url=first.v1, api_key="unused", max_retries=0) as sdk:
            kept = ask(sdk, input="My name is Ada.")
    with running_server(tmp_path, "--response-store-path", store) as second:
        with openai.OpenAI(base_url=second.v1, api_key="unused", max_retries=0) as sdk:
            assert sdk.responses.retrieve(kept.id).output_text == kept.output_text
            follow = ask(sdk, input="What is my name?", previous_response_id=kept.id)
            assert follow.previous_response_id == kept.id
            assert follow.usage.input_tokens > ask(sdk, input="What is my name?").usage.input_tokens
            sdk.responses.delete(kept.id)
            with pytest.raises(openai.NotFoundError):
                sdk.responses.retrieve(kept.id)
