"""response_format: the output parses and validates against the schema every time, unary
and streamed, greedy and sampled; schemas the engine could not compile are a 400."""

from __future__ import annotations

import json

import jsonschema
import pytest

from helpers import chat_body, post
from sse import check_chat_choices, stream_post

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "happy": {"type": "boolean"},
    },
    "required": ["name", "age", "happy"],
    "additionalProperties": False,
}
ORDER = {
    "type": "object",
    "properties": {
        "customer": {
            "type": "object",
            "properties": {
                "id": {"type": "integer", "minimum": 0, "maximum": 9999},
                "tier": {"type": "string", "enum": ["gold", "silver", "bronze"]},
            },
            "required": ["id", "tier"],
            "additionalProperties": False,
        },
        "items": {
            "type": "array",
            "minItems": 1,
            "maxItems": 1,  # one nested object is the point; a second only costs tokens
            "items": {
                "type": "object",
                # Bounded, as every value here, so that the grammar ends within max_tokens.
                "properties": {"sku": {"type": "string", "maxLength": 8}, "price": {"type": "integer", "maximum": 999}},
                "required": ["sku", "price"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["customer", "items"],
    "additionalProperties": False,
}
COLOURS = {
    "type": "object",
    "properties": {
        "colours": {
            "type": "array",
            "items": {"type": "string", "enum": ["red", "green", "blue"]},
            "minItems": 2,
            "maxItems": 2,
        },
        "$defs_used": {"$ref": "#/$defs/flag"},
    },
    "required": ["colours", "$defs_used"],
    "additionalProperties": False,
    "$defs": {"flag": {"type": "boolean"}},
}
SCHEMAS = {"person": PERSON, "order": ORDER, "colours_with_ref": COLOURS}
SAMPLING = {"greedy": {"temperature": 0}, "sampled": {"temperature": 1.0, "seed": 7}}


def schema_format(name: str, schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def request_body(name: str, sampling: str, **extra) -> dict:
    return chat_body(
        f"Give me an example {name.replace('_', ' ')} as JSON.",
        max_tokens=160,
        response_format=schema_format(name, SCHEMAS[name]),
        **SAMPLING[sampling],
        **extra,
    )


def assert_valid(text: str, schema: dict) -> None:
    jsonschema.validate(json.loads(text), schema)


def free_whitespace(text: str) -> list[int]:
    """Where `text` has whitespace outside its JSON strings other than the one space after
    each ':' and ',' (XGrammar's separators without free whitespace)."""
    found = []
    inside = escaped = False
    for at, char in enumerate(text):
        if inside:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                inside = False
        elif char == '"':
            inside = True
        elif char.isspace() and not (char == " " and at > 0 and text[at - 1] in ":,"):
            found.append(at)
    return found


def test_free_whitespace_is_found_outside_strings_only():
    assert free_whitespace('{"a b": [1, 2], "c": "x\\" y"}') == []
    assert free_whitespace('{\n "a": 1}') == [1, 2]
    assert free_whitespace('{"a":  1}') == [6]


@pytest.mark.parametrize("sampling", SAMPLING)
@pytest.mark.parametrize("name", SCHEMAS)
def test_unary_and_streamed_output_match_the_schema_and_each_other(server, name, sampling):
    body = request_body(name, sampling)
    reply = post(server.base_url, "/v3/chat/completions", body)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    # The grammar ends the object, and the object ends the output, well within max_tokens.
    assert choice["finish_reason"] == "stop", choice
    assert_valid(choice["message"]["content"], SCHEMAS[name])
    assert free_whitespace(choice["message"]["content"]) == []
    streamed = check_chat_choices(stream_post(server.base_url, "/v3/chat/completions", {**body, "stream": True}), 1)
    assert streamed.texts[0] == choice["message"]["content"]
    assert streamed.finish_reasons == ["stop"]


# Every value bounded: written compactly, the whole object is about 20 tokens.
TIGHT = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "tier": {"enum": ["gold", "silver", "bronze"]},
    },
    "required": ["ok", "n", "tier"],
    "additionalProperties": False,
}


def test_sampled_output_has_no_free_whitespace_and_ends_within_a_tight_budget(server):
    """The grammar allows no whitespace beyond one space after ':' and ',' (as vLLM's
    option to disable free whitespace), so a bounded schema ends within its budget
    whatever the sample: with free whitespace, a sampled reply could spend the budget on
    blank lines and end cut off inside the object."""
    # The longest reply TIGHT allows is 40 characters: written in one-character tokens,
    # with the end-of-sequence token, 41 tokens; the budget leaves room beyond that.
    for seed in range(8):
        body = chat_body("Reply as JSON.", max_tokens=48, temperature=1.5, seed=seed)
        body["response_format"] = schema_format("tight", TIGHT)
        choice = post(server.base_url, "/v3/chat/completions", body).json()["choices"][0]
        content = choice["message"]["content"]
        assert choice["finish_reason"] == "stop", (seed, content)
        assert_valid(content, TIGHT)
        assert free_whitespace(content) == [], (seed, content)


@pytest.mark.parametrize("prompt", ["What is 2+2? Reply as JSON.", "Describe a cat as JSON.", "Hi"])
def test_json_object_gives_a_json_object(server, prompt):
    """The reply is a JSON object, or (where the model rambles on inside it until
    max_tokens, as this small one may) the start of one; an object it closes parses."""
    body = chat_body(prompt, max_tokens=60, temperature=0, response_format={"type": "json_object"})
    choice = post(server.base_url, "/v3/chat/completions", body).json()["choices"][0]
    content = choice["message"]["content"]
    assert content.lstrip().startswith("{"), content
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(content), dict)
    else:
        assert choice["finish_reason"] == "length"


def test_text_format_is_unconstrained(server):
    plain = post(server.base_url, "/v3/chat/completions", chat_body("Say hi", max_tokens=8, temperature=0)).json()
    text = post(
        server.base_url,
        "/v3/chat/completions",
        chat_body("Say hi", max_tokens=8, temperature=0, response_format={"type": "text"}),
    ).json()
    assert text["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]


def test_sdk_parse_helper_gets_a_valid_object(client):
    reply = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": "Describe a person."}],
        max_tokens=120,
        temperature=0,
        response_format=schema_format("person", PERSON),
    )
    assert_valid(reply.choices[0].message.content, PERSON)


def test_structural_tags_constrain_only_the_tagged_region(server):
    """Free text, but whatever follows the trigger must be the tagged JSON."""
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    }
    response_format = {
        "type": "structural_tag",
        "structures": [{"begin": "<answer>", "schema": schema, "end": "</answer>"}],
        "triggers": ["<answer>"],
    }
    body = chat_body(
        'What is the capital of France? Answer inside <answer>{"city": ...}</answer>.',
        max_tokens=60,
        temperature=0,
        response_format=response_format,
    )
    reply = post(server.base_url, "/v3/chat/completions", body)
    assert reply.status_code == 200, reply.text
    text = reply.json()["choices"][0]["message"]["content"]
    if "<answer>" in text:
        inner = text.split("<answer>", 1)[1].split("</answer>", 1)[0]
        assert_valid(inner, schema)


BAD_FORMATS = [
    (
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}},
        "response_format.json_schema.schema",
    ),
    (
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/missing"}}},
        "response_format.json_schema.schema",
    ),
    # References the engine does not follow: an anchor (it would constrain nothing), another
    # document, and paths valid in JSON Schema that XGrammar cannot walk (an array's item,
    # escaped keys: a fatal error that ended the server), or that lead into a `const`
    # holding a reference to nowhere.
    *(
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}, "response_format.json_schema.schema")
        for schema in (
            {"$ref": "#flag"},
            {"$ref": "flag.json"},
            {"anyOf": [{"type": "boolean"}], "$ref": "#/anyOf/0"},
            {"$defs": {"a/b": {"type": "boolean"}}, "$ref": "#/$defs/a~1b"},
            {"$defs": {"a b": {"type": "boolean"}}, "$ref": "#/$defs/a%20b"},
            {"const": {"$ref": "#/nowhere"}, "$ref": "#/const"},
        )
    ),
    (
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(((("}}},
        "response_format.json_schema.schema",
    ),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": 5}}, "response_format.json_schema.schema"),
    ({"type": "json_schema"}, "response_format.json_schema"),
    ({"type": "yaml"}, "response_format.type"),
    ({"json_schema": {}}, "response_format"),
    ({"type": "structural_tag", "structures": [], "triggers": ["<a>"]}, "response_format.structures"),
    (
        {"type": "structural_tag", "structures": [{"begin": "<b>", "schema": {}, "end": "</b>"}], "triggers": ["<a"]},
        "response_format.structures[0].begin",
    ),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("response_format, param", BAD_FORMATS)
def test_unusable_formats_are_a_400_naming_the_field(server, response_format, param, stream):
    body = chat_body("x", max_tokens=8, response_format=response_format, stream=stream)
    reply = post(server.base_url, "/v3/chat/completions", body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"


def test_a_bad_schema_does_not_disturb_a_running_request(server):
    """Nothing reaches the engine that it would fail on mid-step (which would fail every
    request in that step): a stream running meanwhile completes."""
    import threading

    result = {}

    def run_stream():
        body = chat_body("Tell me a story", max_tokens=40, ignore_eos=True, temperature=0, stream=True)
        result["chunks"] = stream_post(server.base_url, "/v3/chat/completions", body)

    worker = threading.Thread(target=run_stream)
    worker.start()
    for _ in range(3):
        bad = chat_body("x", max_tokens=8, response_format=BAD_FORMATS[1][0])
        assert post(server.base_url, "/v3/chat/completions", bad).status_code == 400
    worker.join(60)
    streamed = check_chat_choices(result["chunks"], 1)
    assert streamed.finish_reasons == ["length"]
