"""Output formats a request asks for, checked and read into the scheduler's
OutputConstraint: chat's `response_format`, the Responses API's `text.format`, and the
JSON array a forced `tool_choice` holds the model to.

The engine compiles a constraint inside its first step, and a constraint it cannot
compile fails that whole step, every request in it. So everything is checked here first:
the schema against JSON Schema's meta-schema, and every `$ref` resolved within the
document (XGrammar follows local references only). Raw regex and EBNF grammars are not
offered to clients for the same reason: nothing short of compiling them can check them.

Every endpoint reads its formats here, so they share the same rules and messages;
scheduler/params.py turns the result into the engine's configuration.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


from ovtrio.scheduler import OutputConstraint, TaggedRegion

# A forced "required" choice may make several calls (parallel_tool_calls); a small model
# left unbounded can keep adding them, so the array is capped.
MAX_PARALLEL_CALLS = 4


class ConstraintError(ValueError):
    """The constraint cannot be used; `param` names the offending field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class FunctionTool:
    name: str
    description: str | None
    parameters: dict[str, Any] | None


ANY_JSON_OBJECT = json.dumps({"type": "object"})


def checked_schema(schema: Any, param: str) -> str:
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, dict):
        raise ConstraintError(f"Invalid value for '{param}': a JSON schema must be an object.", param)
    import jsonschema  # 0.2 s to import: only when a request brings a schema

    try:
        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        raise ConstraintError(
            f"Invalid value for '{param}': not a valid JSON schema{f' at {where}' if where else ''}: {exc.message}",
            param,
        ) from None
    for ref in _refs(schema):
        if not _resolves(schema, ref):
            raise ConstraintError(
                f"Invalid value for '{param}': $ref '{ref}' does not point inside the schema.", param
            )
    return json.dumps(schema)


def _refs(schema: dict[str, Any]) -> list[str]:
    """Every `$ref` in the schema's subschemas: the dialect ($schema, 2020-12 by default)
    says which keywords hold subschemas, so a "$ref" inside `const`, `enum`, `default`,
    `examples` or an unknown keyword is data, not a reference."""
    import referencing.jsonschema

    specification = referencing.jsonschema.specification_with(
        schema.get("$schema", ""), default=referencing.jsonschema.DRAFT202012
    )
    found = []
    pending = [specification.create_resource(schema)]
    while pending:
        resource = pending.pop()
        if isinstance(resource.contents, dict) and isinstance(resource.contents.get("$ref"), str):
            found.append(resource.contents["$ref"])
        pending.extend(resource.subresources())
    return found


def _resolves(schema: dict[str, Any], ref: str) -> bool:
    """Whether `ref` is a fragment ("#" or a JSON pointer) that points inside `schema`.

    XGrammar resolves every reference from the document's root and retrieves nothing, so
    the document is registered as an opaque resource: an `$id` in it neither moves the
    base of a reference nor makes another document reachable."""
    from referencing import Registry, Resource
    from referencing.exceptions import Unresolvable

    if not ref.startswith("#"):
        return False
    resolver = Registry().with_resource("", Resource.opaque(schema)).resolver()
    try:
        resolver.lookup(ref)
    # A pointer that steps into a number or string, or names a list's item by a word,
    # fails inside referencing with the built-in error rather than PointerToNowhere.
    except (Unresolvable, LookupError, TypeError, ValueError):
        return False
    return True


def _json_schema_format(spec: Any, param: str) -> OutputConstraint:
    if not isinstance(spec, dict):
        raise ConstraintError(f"Missing required parameter: '{param}'.", param)
    if "schema" not in spec:
        # OpenAI allows an omitted schema: any JSON.
        return OutputConstraint(json_schema=json.dumps({}))
    return OutputConstraint(json_schema=checked_schema(spec["schema"], f"{param}.schema"))


def _structural_tags(spec: dict[str, Any], param: str) -> OutputConstraint:
    structures = spec.get("structures")
    triggers = spec.get("triggers")
    if not isinstance(structures, list) or not structures:
        raise ConstraintError(f"Invalid value for '{param}.structures': a non-empty list is required.", f"{param}.structures")
    if not isinstance(triggers, list) or not triggers or not all(isinstance(t, str) and t for t in triggers):
        raise ConstraintError(f"Invalid value for '{param}.triggers': a non-empty list of strings is required.", f"{param}.triggers")
    regions = []
    for i, item in enumerate(structures):
        where = f"{param}.structures[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("begin"), str) or not isinstance(item.get("end"), str):
            raise ConstraintError(f"Invalid value for '{where}': begin and end strings are required.", where)
        if not any(item["begin"].startswith(t) for t in triggers):
            raise ConstraintError(f"Invalid value for '{where}.begin': it must start with one of the triggers.", f"{where}.begin")
        regions.append(TaggedRegion(item["begin"], checked_schema(item.get("schema", {}), f"{where}.schema"), item["end"]))
    return OutputConstraint(tags=tuple(regions), triggers=tuple(triggers))


def from_response_format(value: Any, param: str = "response_format") -> OutputConstraint | None:
    """Chat completions' `response_format`: text, json_object, json_schema, or XGrammar
    structural tags ({"type": "structural_tag", "structures": [...], "triggers": [...]})."""
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise ConstraintError(f"Invalid value for '{param}': an object with a 'type' is required.", param)
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputConstraint(json_schema=ANY_JSON_OBJECT)
    if kind == "json_schema":
        return _json_schema_format(value.get("json_schema"), f"{param}.json_schema")
    if kind in ("structural_tag", "structural_tags"):
        return _structural_tags(value, param)
    raise ConstraintError(
        f"Invalid value for '{param}.type': '{kind}' is not one of text, json_object, json_schema,"
        " structural_tag.",
        f"{param}.type",
    )


def from_text_format(value: Any, param: str = "text.format") -> OutputConstraint | None:
    """The Responses API's `text.format`: like response_format, with the json_schema
    fields (name, schema, strict) flattened into the format object."""
    if isinstance(value, dict) and value.get("type") == "json_schema":
        return _json_schema_format(value, param)
    return from_response_format(value, param)


def forced_call_constraint(
    tools: list[FunctionTool], *, only: str | None = None, parallel: bool = True, param: str = "tools"
) -> OutputConstraint:
    """The constraint for calling `only` (a named tool_choice), or any of `tools`."""
    variants = []
    for i, tool in enumerate(tools):
        if only is not None and tool.name != only:
            continue
        parameters = tool.parameters or {"type": "object", "properties": {}}
        arguments = json.loads(checked_schema(parameters, f"{param}[{i}].function.parameters"))
        variants.append(
            {
                "type": "object",
                "properties": {"name": {"type": "string", "enum": [tool.name]}, "arguments": arguments},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    if not variants:
        raise ConstraintError("tool_choice names no tool that was sent.", "tool_choice")
    most = 1 if only is not None or not parallel else MAX_PARALLEL_CALLS
    call = variants[0] if len(variants) == 1 else {"anyOf": variants}
    schema = {"type": "array", "items": call, "minItems": 1, "maxItems": most}
    return OutputConstraint(json_schema=json.dumps(schema))


def from_responses_format(value: Any) -> OutputConstraint | None:
    """The Responses API's format: `text.format` (flat), or chat's `response_format`
    nesting, which OVMS accepts there too."""
    if isinstance(value, dict) and "json_schema" in value:
        return from_response_format(value)
    return from_text_format(value, "text.format")
