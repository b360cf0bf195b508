"""Limits on what one request may make the server hold or do: the body's size (413),
a prompt's characters before it is tokenized, a schema's size, the compiled-grammar
cache and the response store in bytes, `metadata` as OpenAI checks it, integer fields
bounded, and the input_items page arguments. Every refusal is a 4xx in OpenAI's error
shape naming the parameter, on every route that takes the field. The limits under the
hypercorn command: test_launcher_parity.py."""

from __future__ import annotations

import json

import httpx
import pytest
import trio
from trio_websocket import open_websocket_url

import loopback
from helpers import assert_error, beside_innocent_streams, post
from server_pool import server_fixture
from test_responses_socket import receive_json, ws_url
from vocab import embedded_vocabulary

MODEL = "SmolLM2-135M-Instruct"
CONTEXT = 8192
# The embedded vocabulary's longest token (a newline and 80 spaces) is 81 characters:
# no prompt over 8192 x 81 characters fits the context.
MAX_PROMPT_CHARS = CONTEXT * 81
DEFAULT_BODY_BYTES = 2 * 1024 * 1024
DEFAULT_SCHEMA_BYTES = 64 * 1024

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"


def chat_body(content: str = "Hi", **fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 2, **fields}


def completion_body(prompt="Hi", **fields) -> dict:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 2, **fields}


def response_body(input: str | list = "Hi", **fields) -> dict:
    return {"model": MODEL, "input": input, "max_output_tokens": 2, **fields}


# ---- the body's size ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS, RESPONSES, "/tokenize"])
def test_a_body_over_the_limit_is_a_413_in_openai_shape(server, path):
    text = "a" * (DEFAULT_BODY_BYTES + 1000)
    body = {"/tokenize": {"prompt": text}, CHAT: chat_body(text), COMPLETIONS: completion_body(text)}.get(
        path, response_body(text)
    )
    prompted = server.metric("vllm:prompt_tokens_total")
    response = post(server.base_url, path, body)
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "request_too_large" and "--max-body-bytes" in error["message"]
    assert server.metric("vllm:prompt_tokens_total") == prompted  # refused, not worked through


def test_a_chunked_body_over_the_limit_is_a_413_too(server):
    def chunks():
        yield b'{"model": "' + MODEL.encode() + b'", "prompt": "'
        for _ in range(40):
            yield b"a" * 65536
        yield b'"}'

    response = loopback.post(
        server.base_url + "/tokenize", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


# ---- a prompt's characters ---------------------------------------------------------------------

# Under the body limit, over what the context can hold whatever the text says.
LONG = "ab " * (MAX_PROMPT_CHARS // 3 + 10)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {"prompt": LONG}, "prompt"),
        ("/tokenize", {"messages": [{"role": "user", "content": LONG}]}, "messages"),
        (COMPLETIONS, completion_body(LONG), "prompt"),
        (COMPLETIONS, completion_body(["Hi", LONG]), "prompt"),
        (CHAT, chat_body(LONG), "messages"),
        (CHAT, {**chat_body(), "messages": [{"role": "user", "content": LONG[: len(LONG) // 2]}] * 2}, "messages"),
        (RESPONSES, response_body(LONG), "input"),
        (RESPONSES, response_body(instructions=LONG), "input"),
    ],
    ids=[
        "tokenize-prompt",
        "tokenize-messages",
        "completions",
        "completions-list",
        "chat",
        "chat-two-halves",
        "responses",
        "responses-instructions",
    ],
)
def test_a_prompt_longer_than_the_context_can_hold_is_refused_before_tokenizing(server, path, body, param):
    response = post(server.base_url, path, body)
    assert_error(response, 400, param=param)
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert str(MAX_PROMPT_CHARS) in error["message"]


def test_a_prompt_just_under_the_bound_is_still_counted(server):
    # Under the character bound the prompt is tokenized and counted exactly as before.
    text = "hello there " * 20_000  # 240,000 characters, some 40,000 tokens
    reply = post(server.base_url, "/tokenize", {"prompt": text}).json()
    assert reply["count"] > CONTEXT
    piece = post(server.base_url, "/tokenize", {"prompt": "hello there " * 100}).json()["count"]
    assert abs(reply["count"] - 200 * piece) <= 200


async def test_the_websocket_refuses_a_too_long_input_and_stays_open(server):
    async with open_websocket_url(ws_url(server), max_message_size=8 * 1024 * 1024) as ws:
        await ws.send_message(json.dumps({"type": "response.create", **response_body(LONG[:3_000_000])}))
        with trio.fail_after(60):
            error = await receive_json(ws)
        assert error["type"] == "error" and error["param"] == "input" and error["code"] == "context_length_exceeded"
        await ws.send_message(json.dumps({"type": "response.create", **response_body(metadata={"k": "v" * 513})}))
        with trio.fail_after(60):
            error = await receive_json(ws)
        assert error["type"] == "error" and error["param"] == "metadata.k"


# ---- a schema's size ---------------------------------------------------------------------------


def big_enum(count: int, tag: str = "") -> dict:
    return {"type": "string", "enum": [f"{tag}value-{i}" for i in range(count)]}


OVERSIZED = big_enum(8000)  # about 120 KB of JSON


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            CHAT,
            chat_body(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": OVERSIZED}}),
            "response_format",
        ),
        (
            RESPONSES,
            response_body(text={"format": {"type": "json_schema", "name": "x", "schema": OVERSIZED}}),
            "text.format",
        ),
        (
            CHAT,
            chat_body(
                tools=[
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": OVERSIZED}}},
                    }
                ],
                tool_choice="required",
            ),
            "tools[0].function.parameters",
        ),
        (
            RESPONSES,
            response_body(
                tools=[
                    {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"a": OVERSIZED}}}
                ]
            ),
            "tools[0].function.parameters",
        ),
    ],
    ids=["chat-response-format", "responses-text-format", "chat-forced-tool", "responses-tool"],
)
def test_a_schema_over_the_limit_is_refused_naming_it(server, path, body, param):
    response = post(server.base_url, path, body)
    assert_error(response, 400, param=param)
    assert response.json()["error"]["code"] == "schema_too_large"


def test_a_schema_under_the_limit_is_served(server):
    schema = big_enum(3000)
    assert len(json.dumps(schema)) < DEFAULT_SCHEMA_BYTES
    body = chat_body(
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}, max_tokens=12
    )
    response = post(server.base_url, CHAT, body)
    assert response.status_code == 200, response.text
    content = response.json()["choices"][0]["message"]["content"]
    assert response.json()["choices"][0]["finish_reason"] == "length" or json.loads(content) in schema["enum"]


# ---- the compiled-grammar cache ----------------------------------------------------------------

GRAMMAR_CACHE_BYTES = 40_000_000
# Enums of 20,000 strings compile to about 34 MB each (XGrammar's estimate; about as
# much resident memory), so each new one evicts the one before.
BIG_SCHEMA_BYTES = 600_000

grammar_server = server_fixture(
    "grammar_server",
    "--max-schema-bytes",
    str(BIG_SCHEMA_BYTES),
    "--grammar-cache-bytes",
    str(GRAMMAR_CACHE_BYTES),
    # These enums take more than the default 2 s to compile on a small machine.
    "--grammar-compile-seconds",
    "60",
    "--response-store-bytes",
    "100000",
)


def rss_bytes(server) -> int:
    with open(f"/proc/{server.process.pid}/statm") as file:
        return int(file.read().split()[1]) * 4096


def constrained(server, schema: dict) -> None:
    body = chat_body(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    response = post(server.base_url, CHAT, body)
    assert response.status_code == 200, response.text


def test_the_compiled_grammar_cache_is_bounded_in_bytes(grammar_server):
    constrained(grammar_server, big_enum(20_000, "warm-up"))  # the compiler's own start-up memory
    before = rss_bytes(grammar_server)
    largest = 0
    for round in range(6):
        constrained(grammar_server, big_enum(20_000, f"r{round}-"))
        held = grammar_server.metric("ovtrio_grammar_cache_bytes")
        largest = max(largest, held)
    # XGrammar evicts before it adds: the cache holds its limit and one grammar at most.
    assert 0 < largest <= GRAMMAR_CACHE_BYTES + 40_000_000
    # Unbounded, six more grammars of ~34 MB each stay resident (+200 MB and more).
    assert rss_bytes(grammar_server) - before < 120_000_000


# ---- the response store ------------------------------------------------------------------------


# One token each (a newline and 39 spaces): long stored inputs that prefill quickly.
def spaces(tokens: int) -> str:
    return ("\n" + " " * 39) * tokens


def stored_bytes(server) -> float:
    return server.metric("ovtrio_response_store_bytes")


def test_the_response_store_is_bounded_in_bytes(grammar_server):
    # A 100,000-byte store holds two responses of 20,000 characters of input (kept as
    # the input items and again in the conversation), not three.
    text = spaces(500)
    ids = []
    for _ in range(3):
        response = post(grammar_server.base_url, RESPONSES, response_body(text))
        assert response.status_code == 200, response.text
        ids.append(response.json()["id"])
    assert stored_bytes(grammar_server) <= 100_000
    assert loopback.get(f"{grammar_server.base_url}/v1/responses/{ids[0]}").status_code == 404
    assert loopback.get(f"{grammar_server.base_url}/v1/responses/{ids[2]}").status_code == 200


def test_delete_releases_the_stored_bytes(server):
    before = stored_bytes(server)
    response = post(server.base_url, RESPONSES, response_body(spaces(500)))
    response_id = response.json()["id"]
    held = stored_bytes(server)
    assert held - before > 40_000  # the 20,000-character input, as input items and conversation
    deleted = loopback.delete(f"{server.base_url}/v1/responses/{response_id}")
    assert deleted.status_code == 200
    assert stored_bytes(server) <= held - 40_000


# ---- metadata ----------------------------------------------------------------------------------

BAD_METADATA = [
    ({f"k{i}": "v" for i in range(17)}, "metadata"),
    ({"k" * 65: "v"}, "metadata." + "k" * 64),
    ({"k": "v" * 513}, "metadata.k"),
    ({"k": 5}, "metadata.k"),
    ("not an object", "metadata"),
]


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS, RESPONSES])
@pytest.mark.parametrize(
    ("metadata", "param"), BAD_METADATA, ids=["17-pairs", "long-key", "long-value", "number", "string"]
)
def test_metadata_is_checked_as_openai_does(server, path, metadata, param):
    body = {CHAT: chat_body, COMPLETIONS: completion_body, RESPONSES: response_body}[path](metadata=metadata)
    assert_error(post(server.base_url, path, body), 400, param=param)


def data_string(characters: int) -> str:
    return ("data:text/plain;base64," + "QUJD" * characters)[:characters]


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS, RESPONSES])
@pytest.mark.parametrize("characters", [600, 1_200_000], ids=["small-body", "body-over-1-MiB"])
def test_a_data_string_in_metadata_is_checked_in_a_body_of_any_size(server, path, characters):
    """Data URLs are lifted out of bodies over 1 MiB before parsing; one that is not an
    image's is checked as any string is."""
    body = {CHAT: chat_body, COMPLETIONS: completion_body, RESPONSES: response_body}[path](
        metadata={"k": data_string(characters)}
    )
    assert (len(json.dumps(body)) > 1024 * 1024) == (characters > 1024 * 1024)
    replies = []
    beside_innocent_streams(server, lambda: replies.append(post(server.base_url, path, body)))
    assert_error(replies[0], 400, param="metadata.k")
    # A data string in a text field is text: the body is served as a whole parse serves it.
    text = {CHAT: chat_body, COMPLETIONS: completion_body, RESPONSES: response_body}[path](data_string(characters))
    response = post(server.base_url, path, text)
    assert response.status_code in (200, 400), response.text
    if response.status_code == 400:  # more than the context holds, counted as text
        assert response.json()["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS, RESPONSES])
def test_a_data_string_as_a_metadata_key_is_checked_in_a_body_over_1_mib(server, path):
    key = data_string(1_200_000)
    body = {CHAT: chat_body, COMPLETIONS: completion_body, RESPONSES: response_body}[path](metadata={key: "v"})
    assert len(json.dumps(body)) > 1024 * 1024
    assert_error(post(server.base_url, path, body), 400, param="metadata." + key[:64])


async def test_the_websocket_checks_a_data_string_in_metadata_in_a_large_frame(server):
    async with open_websocket_url(ws_url(server), max_message_size=8 * 1024 * 1024) as ws:
        for characters in (600, 1_200_000):
            for metadata, param in (
                ({"k": data_string(characters)}, "metadata.k"),
                ({data_string(characters): "v"}, "metadata." + data_string(characters)[:64]),
            ):
                request = response_body(metadata=metadata)
                await ws.send_message(json.dumps({"type": "response.create", **request}))
                with trio.fail_after(60):
                    error = await receive_json(ws)
                assert error["type"] == "error" and error["param"] == param, error


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS, RESPONSES])
def test_the_largest_metadata_openai_allows_is_accepted(server, path):
    metadata = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}
    body = {CHAT: chat_body, COMPLETIONS: completion_body, RESPONSES: response_body}[path](metadata=metadata)
    response = post(server.base_url, path, body)
    assert response.status_code == 200, response.text
    if path == RESPONSES:
        assert response.json()["metadata"] == metadata


# ---- integer fields ----------------------------------------------------------------------------

HUGE = 2**63

INTEGER_FIELDS = [
    (COMPLETIONS, "top_k"),
    (COMPLETIONS, "min_tokens"),
    (COMPLETIONS, "seed"),
    (COMPLETIONS, "n"),
    (COMPLETIONS, "best_of"),
    (COMPLETIONS, "logprobs"),
    (COMPLETIONS, "max_tokens"),
    (CHAT, "top_k"),
    (CHAT, "min_tokens"),
    (CHAT, "max_completion_tokens"),
    (CHAT, "top_logprobs"),
    (RESPONSES, "top_k"),
    (RESPONSES, "max_output_tokens"),
]


@pytest.mark.parametrize(("path", "field"), INTEGER_FIELDS, ids=[f"{p.split('/')[-1]}-{f}" for p, f in INTEGER_FIELDS])
@pytest.mark.parametrize("value", [HUGE, -HUGE], ids=["2**63", "-2**63"])
def test_integer_fields_are_bounded(server, path, field, value):
    body = {CHAT: chat_body, COMPLETIONS: completion_body, RESPONSES: response_body}[path]()
    body[field] = value
    if field == "max_completion_tokens":
        body.pop("max_tokens")
    assert_error(post(server.base_url, path, body), 400, param=field)


@pytest.mark.parametrize(
    ("extra", "param"), [({"stop_token_ids": [HUGE]}, "stop_token_ids[0]"), ({"nvext": {"top_k": HUGE}}, "nvext.top_k")]
)
def test_nested_integer_fields_are_bounded(server, extra, param):
    assert_error(post(server.base_url, COMPLETIONS, completion_body(**extra)), 400, param=param)


OUTSIDE_VOCABULARY = {
    "min-tokens": {"min_tokens": 2},
    "json-schema": {
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}}
    },
}


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
@pytest.mark.parametrize("extra", OUTSIDE_VOCABULARY.values(), ids=OUTSIDE_VOCABULARY.keys())
def test_a_stop_token_id_outside_the_vocabulary_is_refused_beside_three_streams(server, path, extra):
    """The engine writes each stop id's logit (min_tokens) and its bit in a grammar's
    token mask, in a step that cannot raise: an id past the vocabulary never gets there."""
    stop = embedded_vocabulary().size + 5
    body = {CHAT: chat_body, COMPLETIONS: completion_body}[path](stop_token_ids=[stop], **extra)
    replies = []
    beside_innocent_streams(server, lambda: replies.append(post(server.base_url, path, body)))
    error = assert_error(replies[0], 400, param="stop_token_ids[0]")
    assert str(stop) in error["message"]
    assert httpx.get(f"{server.base_url}/health/ready").status_code == 200


def test_nan_is_not_a_number_any_field_takes(server):
    response = post(
        server.base_url, COMPLETIONS, content=f'{{"model": "{MODEL}", "prompt": "Hi", "length_penalty": NaN}}'
    )
    assert_error(response, 400, param="length_penalty")


# ---- input_items paging ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def three_items(server) -> str:
    items = [{"role": "user", "content": text} for text in ("one", "two", "three")]
    return post(server.base_url, RESPONSES, response_body(items)).json()["id"]


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("limit=0", "limit"),
        ("limit=-5", "limit"),
        ("limit=abc", "limit"),
        ("limit=101", "limit"),
        ("order=sideways", "order"),
        ("after=nope", "after"),
    ],
)
def test_input_items_page_arguments_are_checked(server, three_items, query, param):
    response = loopback.get(f"{server.base_url}/v1/responses/{three_items}/input_items?{query}")
    assert_error(response, 400, param=param)


def test_input_items_pages(server, three_items):
    def page(query: str) -> dict:
        response = loopback.get(f"{server.base_url}/v1/responses/{three_items}/input_items?{query}")
        assert response.status_code == 200, response.text
        return response.json()

    def texts(listing: dict) -> list[str]:
        return [item["content"][0]["text"] for item in listing["data"]]

    assert texts(page("")) == ["three", "two", "one"]  # OpenAI's default order: desc
    first = page("limit=2&order=asc")
    assert texts(first) == ["one", "two"] and first["has_more"] is True
    rest = page(f"limit=2&order=asc&after={first['last_id']}")
    assert texts(rest) == ["three"] and rest["has_more"] is False
    assert texts(page("limit=1")) == ["three"]


# ---- null is the default -----------------------------------------------------------------------


def _spec_schemas() -> dict:
    from openai_schema import SPEC

    with open(SPEC, encoding="utf-8") as file:
        return json.load(file)["components"]["schemas"]


def _properties(schemas: dict, node: dict) -> dict:
    """Every property of a request schema, through $ref and allOf."""
    if "$ref" in node:
        return _properties(schemas, schemas[node["$ref"].split("/")[-1]])
    found = dict(node.get("properties", {}))
    for part in node.get("allOf", []):
        found.update(_properties(schemas, part))
    return found


def _nullable(schemas: dict, node: dict) -> bool:
    if "$ref" in node:
        return _nullable(schemas, schemas[node["$ref"].split("/")[-1]])
    if node.get("nullable") or node.get("type") == "null":
        return True
    return any(_nullable(schemas, option) for key in ("anyOf", "oneOf") for option in node.get(key, []))


# Nullable in the spec, and what null means there is not this server's default:
# OpenAI's completions default prompt is GPT's own end-of-text token.
NOT_A_DEFAULT = {("CreateCompletionRequest", "prompt")}

BASES = {
    "CreateCompletionRequest": (COMPLETIONS, completion_body),
    "CreateChatCompletionRequest": (CHAT, chat_body),
    "CreateResponse": (RESPONSES, response_body),
}


def _nullable_fields() -> list[tuple[str, str]]:
    schemas = _spec_schemas()
    return [
        (name, field)
        for name in BASES
        for field, node in sorted(_properties(schemas, schemas[name]).items())
        if _nullable(schemas, node) and (name, field) not in NOT_A_DEFAULT
    ]


NULLABLE = _nullable_fields()


def test_the_spec_walk_finds_the_fields_reported_refused():
    assert {
        ("CreateCompletionRequest", "n"),
        ("CreateChatCompletionRequest", "stream"),
        ("CreateChatCompletionRequest", "logprobs"),
        ("CreateCompletionRequest", "echo"),
        ("CreateResponse", "store"),
    } <= set(NULLABLE)


@pytest.mark.parametrize(("schema", "field"), NULLABLE, ids=[f"{s}.{f}" for s, f in NULLABLE])
def test_every_nullable_field_accepts_null_as_its_default(server, schema, field):
    path, make = BASES[schema]
    body = make()
    body[field] = None
    if field in ("max_tokens", "max_output_tokens"):
        # The default is the rest of the context: end the reply at its first word instead.
        body["stop"] = [" ", "\n", "."]
        if path == CHAT:
            body["max_completion_tokens"] = 2
    response = post(server.base_url, path, body)
    assert response.status_code == 200, response.text
    reply = response.json()
    assert reply["object"] in ("text_completion", "chat.completion", "response")


# ---- the store's accounting, without a server --------------------------------------------------


async def test_the_store_counts_bytes_and_drops_the_oldest_beyond_them():
    from ovtrio.api.responses.store import ResponseStore, StoredResponse, memory_size

    def entry(index: int, text: str) -> StoredResponse:
        return StoredResponse({"id": f"resp_{index}"}, [{"content": text}], [{"role": "user", "content": text}])

    text = "x" * 10_000
    assert memory_size([{"content": text}]) > 10_000
    store = ResponseStore(max_entries=100, max_age_seconds=60, max_bytes=45_000)
    for index in range(3):
        await store.put(entry(index, text))
    assert len(store) == 2 and store.bytes <= 45_000
    assert await store.get("resp_0") is None and await store.get("resp_2") is not None
    await store.put(entry(9, "y" * 100_000))  # larger than the whole store: not kept
    assert await store.get("resp_9") is None and len(store) == 2
    assert await store.delete("resp_2") and len(store) == 1
    await store.put(entry(1, "z"))  # replacing an entry counts it once
    assert len(store) == 1 and store.bytes == store._entries["resp_1"].size
