"""Validate bodies and stream chunks against OpenAI's published OpenAPI schemas.

The spec is OpenAPI 3.1 but still uses 3.0's `nullable: true` in places; such nodes are
read as "this schema, or null" before validating with JSON Schema 2020-12.
"""

from __future__ import annotations

import copy
import json
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import jsonschema

SPEC = Path(__file__).parent / "data" / "openai-openapi.json"


def _allow_null(node: Any) -> Any:
    if isinstance(node, list):
        return [_allow_null(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _allow_null(value) for key, value in node.items()}
    if node.pop("nullable", False):
        if isinstance(node.get("type"), str) and not any(k in node for k in ("anyOf", "oneOf", "allOf", "$ref")):
            node["type"] = [node["type"], "null"]
            if "enum" in node and None not in node["enum"]:
                node["enum"] = [*node["enum"], None]
        else:
            node = {"anyOf": [node, {"type": "null"}]}
    return node


@lru_cache(maxsize=1)
def _components() -> dict[str, Any]:
    with open(SPEC, encoding="utf-8") as file:
        spec = json.load(file)
    return {"schemas": _allow_null(spec["components"]["schemas"])}


@cache
def _validator(name: str, overrides: tuple[tuple[str, str], ...] = ()) -> jsonschema.Draft202012Validator:
    components = _components()
    if overrides:
        components = copy.deepcopy(components)
        for path, replacement in overrides:
            _apply_override(components["schemas"], path, json.loads(replacement))
    schema = {"$ref": f"#/components/schemas/{name}", "components": components}
    return jsonschema.Draft202012Validator(schema)


def _apply_override(schemas: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split("/")
    node: Any = schemas
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[last] = value


# The schema types a completion's token_logprobs as numbers and top_logprobs as objects,
# yet OpenAI's legacy API (and vLLM) send null for the first token of an echoed prompt,
# which has no context to be scored in; so does ovtrio.
_LOGPROBS = "CreateCompletionResponse/properties/choices/items/properties/logprobs/anyOf/0/properties"
_NULLABLE_FIRST_PROMPT_TOKEN = (
    (f"{_LOGPROBS}/token_logprobs/items", json.dumps({"type": ["number", "null"]})),
    (
        f"{_LOGPROBS}/top_logprobs/items",
        json.dumps({"anyOf": [{"type": "object", "additionalProperties": {"type": "number"}}, {"type": "null"}]}),
    ),
)


def validate(body: Any, schema_name: str) -> None:
    """Raise jsonschema.ValidationError if `body` does not match the named schema."""
    overrides = _NULLABLE_FIRST_PROMPT_TOKEN if schema_name == "CreateCompletionResponse" else ()
    _validator(schema_name, overrides).validate(body)


# Completion stream chunks reuse the unary schema, whose finish_reason may not be null;
# OpenAI's real API streams null until the last chunk, and so do we. Likewise its usage
# may not be null, yet with stream_options.include_usage every chunk but the last carries
# "usage": null (as CreateChatCompletionStreamResponse, and OpenAI's docs, spell out).
_NULLABLE_COMPLETION_FINISH = (
    (
        "CreateCompletionResponse/properties/choices/items/properties/finish_reason",
        json.dumps({"type": ["string", "null"], "enum": ["stop", "length", "content_filter", None]}),
    ),
    (
        "CreateCompletionResponse/properties/usage",
        json.dumps({"anyOf": [{"$ref": "#/components/schemas/CompletionUsage"}, {"type": "null"}]}),
    ),
)


def validate_completion_chunk(body: Any) -> None:
    _validator("CreateCompletionResponse", _NULLABLE_COMPLETION_FINISH + _NULLABLE_FIRST_PROMPT_TOKEN).validate(body)
