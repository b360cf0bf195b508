"""Which `$ref`s a request's JSON schema may hold (ovtrio/api/formats.py): exactly those
the engine's XGrammar follows. Pure logic; tests/test_structured_output.py sends the
refused ones to a real server."""

from __future__ import annotations

import pytest

from ovtrio.api.formats import ConstraintError, checked_schema

FLAG = {"type": "boolean"}

FOLLOWED = [
    {"$ref": "#"},
    {"$defs": {"flag": FLAG}, "$ref": "#/$defs/flag"},
    {"definitions": {"flag": FLAG}, "type": "array", "items": {"$ref": "#/definitions/flag"}},
    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    {"$defs": {"any": True}, "properties": {"x": {"$ref": "#/$defs/any"}}},
    # Data, not references: never followed, so never checked.
    {"const": {"$ref": "#/nowhere"}},
    {"enum": [{"$ref": "#/nowhere"}]},
    {"type": "object", "default": {"$ref": "#/nowhere"}, "examples": [{"$ref": "#/nowhere"}]},
    # A reference into a const makes it a schema to the engine; this one is fine.
    {"const": FLAG, "$ref": "#/const"},
    # Property names are keys, not references.
    {"properties": {"$ref": FLAG}},
]

UNFOLLOWED = [
    ({"$ref": "#/$defs/missing"}, "#/$defs/missing"),
    ({"$ref": "#/"}, "#/"),
    ({"$defs": {"flag": FLAG}, "$ref": "#/$defs//flag"}, "#/$defs//flag"),
    ({"$ref": "#flag"}, "#flag"),
    ({"$ref": "flag.json"}, "flag.json"),
    ({"$ref": "https://example.com/flag.json#"}, "https://example.com/flag.json#"),
    ({"anyOf": [FLAG], "items": {"$ref": "#/anyOf/0"}}, "#/anyOf/0"),
    ({"$defs": {"a/b": FLAG}, "$ref": "#/$defs/a~1b"}, "#/$defs/a~1b"),
    ({"$defs": {"a~b": FLAG}, "$ref": "#/$defs/a~0b"}, "#/$defs/a~0b"),
    ({"$defs": {"a b": FLAG}, "$ref": "#/$defs/a%20b"}, "#/$defs/a%20b"),
    ({"required": ["a"], "$ref": "#/required"}, "#/required"),
    ({"type": "string", "$ref": "#/type"}, "#/type"),
    # Reached only through another reference.
    ({"const": {"$ref": "#/nowhere"}, "$ref": "#/const"}, "#/nowhere"),
    ({"x-note": {"$ref": "#/nowhere"}, "$ref": "#/x-note"}, "#/nowhere"),
    ({"$defs": {"a": {"$ref": "#/$defs/b"}}, "properties": {"x": {"$ref": "#/$defs/a"}}}, "#/$defs/b"),
]


@pytest.mark.parametrize("schema", FOLLOWED)
def test_references_the_engine_follows_are_accepted(schema):
    checked_schema(schema, "response_format.json_schema.schema")


@pytest.mark.parametrize("schema, ref", UNFOLLOWED)
def test_references_the_engine_cannot_follow_are_refused_by_name(schema, ref):
    with pytest.raises(ConstraintError) as refused:
        checked_schema(schema, "response_format.json_schema.schema")
    assert refused.value.param == "response_format.json_schema.schema"
    assert f"$ref '{ref}'" in str(refused.value)
