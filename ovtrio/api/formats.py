"""Output formats a request asks for, checked and read into the scheduler's
OutputConstraint: chat's `response_format`, the Responses API's `text.format`, and the
JSON array a forced `tool_choice` holds the model to.

Here a schema is checked against JSON Schema's meta-schema, and every `$ref` followed
within the document as XGrammar will follow it (see _unfollowed_ref): clear messages
for what is plainly wrong. Whether it compiles is then learnt by compiling it, before
the request is admitted (the scheduler does: constraints/check.py), which refuses
what XGrammar cannot build or builds too slowly or too large, naming the field the
constraint came from (OutputConstraint.param). Raw regex and EBNF grammars are not
offered to clients.

Every endpoint reads its formats here, so they share the same rules and messages;
scheduler/params.py turns the result into the engine's configuration.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from ovtrio.errors import FieldError
from ovtrio.scheduler import OutputConstraint, TaggedRegion

# A forced "required" choice may make several calls (parallel_tool_calls); a small model
# left unbounded can keep adding them, so the array is capped.
MAX_PARALLEL_CALLS = 4


class ConstraintError(FieldError):
    """The constraint cannot be used; `param` names the offending field."""


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
    import jsonschema  # by the first request that brings a schema, not at start (docs/benchmarks.md#loading-a-model)

    try:
        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        raise ConstraintError(
            f"Invalid value for '{param}': not a valid JSON schema{f' at {where}' if where else ''}: {exc.message}",
            param,
        ) from None
    unfollowed = _unfollowed_ref(schema)
    if unfollowed is not None:
        raise ConstraintError(
            f"Invalid value for '{param}': $ref '{unfollowed}' does not point to a schema inside the schema"
            " (a '#' or '#/' path of object keys, without escapes).",
            param,
        )
    return json.dumps(schema)


# Keywords whose values are data, not schemas: a "$ref" inside them is not a reference
# (unless a reference points into them, which makes that value a schema to the engine).
_VALUE_KEYWORDS = frozenset({"const", "enum", "default", "examples"})


def _unfollowed_ref(schema: dict[str, Any]) -> str | None:
    """The first `$ref` the engine could not follow, or None.

    XGrammar resolves a reference its own way, not as RFC 6901 and JSON Schema say (so
    not with `referencing`): "#" is the root; "#/a/b" steps through object keys only,
    split on "/" with nothing unescaped (no "~1", no "%20"); anything else it takes for
    "any value". A path it cannot walk is a fatal error that ends the whole process. So
    a reference is followed here as XGrammar follows it, and one it would not resolve
    is refused: "#/items/0", "#/$defs/a~1b", "#name" (an anchor), "other.json#" and
    "#/a//b" alike. Whatever a reference points at is a schema to the engine, and is
    checked in turn, even inside `const` or an unknown keyword. Each object is walked
    once.
    """
    walked: set[int] = set()
    pending: list[Any] = [schema]
    while pending:
        for ref in _refs(pending.pop(), walked):
            target = _follow(schema, ref)
            if not isinstance(target, (dict, bool)):
                return ref
            pending.append(target)
    return None


def _refs(root: Any, walked: set[int]) -> list[str]:
    """The `$ref`s in `root` read as a schema, skipping objects already walked."""
    found = []
    pending = [root]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            if id(node) in walked:
                continue
            walked.add(id(node))
            if isinstance(node.get("$ref"), str):
                found.append(node["$ref"])
            pending.extend(value for key, value in node.items() if key not in _VALUE_KEYWORDS)
        elif isinstance(node, list):
            pending.extend(node)
    return found


_NOWHERE = object()


def _follow(root: dict[str, Any], ref: str) -> Any:
    """What `ref` points at as XGrammar resolves it, or _NOWHERE."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return _NOWHERE
    node: Any = root
    for part in ref[2:].split("/"):
        if not isinstance(node, dict) or part not in node:
            return _NOWHERE
        node = node[part]
    return node


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
        raise ConstraintError(
            f"Invalid value for '{param}.structures': a non-empty list is required.", f"{param}.structures"
        )
    if not isinstance(triggers, list) or not triggers or not all(isinstance(t, str) and t for t in triggers):
        raise ConstraintError(
            f"Invalid value for '{param}.triggers': a non-empty list of strings is required.", f"{param}.triggers"
        )
    regions = []
    for i, item in enumerate(structures):
        where = f"{param}.structures[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("begin"), str) or not isinstance(item.get("end"), str):
            raise ConstraintError(f"Invalid value for '{where}': begin and end strings are required.", where)
        if not any(item["begin"].startswith(t) for t in triggers):
            raise ConstraintError(
                f"Invalid value for '{where}.begin': it must start with one of the triggers.", f"{where}.begin"
            )
        regions.append(
            TaggedRegion(item["begin"], checked_schema(item.get("schema", {}), f"{where}.schema"), item["end"])
        )
    return OutputConstraint(tags=tuple(regions), triggers=tuple(triggers))


def from_response_format(value: Any, param: str = "response_format") -> OutputConstraint | None:
    """Chat completions' `response_format`: text, json_object, json_schema, or XGrammar
    structural tags ({"type": "structural_tag", "structures": [...], "triggers": [...]})."""
    constraint = _format(value, param)
    return None if constraint is None else replace(constraint, param=param)


def _format(value: Any, param: str) -> OutputConstraint | None:
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
        f"Invalid value for '{param}.type': '{kind}' is not one of text, json_object, json_schema, structural_tag.",
        f"{param}.type",
    )


def from_text_format(value: Any, param: str = "text.format") -> OutputConstraint | None:
    """The Responses API's `text.format`: like response_format, with the json_schema
    fields (name, schema, strict) flattened into the format object."""
    if isinstance(value, dict) and value.get("type") == "json_schema":
        return replace(_json_schema_format(value, param), param=param)
    return from_response_format(value, param)


def forced_call_constraint(
    tools: list[FunctionTool], *, only: str | None = None, parallel: bool = True, param: str = "tools"
) -> OutputConstraint:
    """The constraint for calling `only` (a named tool_choice), or any of `tools`.

    Each tool's parameters become the `arguments` of a call object inside the array of
    calls; parameters with references (`$defs` and `$ref`, as every nested pydantic
    model has) are moved under the wrapper's own `$defs` and their references rewritten
    to point there (hoisted), since `#/$defs/X` means the wrapper's root once nested."""
    variants = []
    hoisted: dict[str, Any] = {}
    for i, tool in enumerate(tools):
        if only is not None and tool.name != only:
            continue
        parameters = tool.parameters or {"type": "object", "properties": {}}
        arguments = json.loads(checked_schema(parameters, f"{param}[{i}].function.parameters"))
        if _refs(arguments, set()):
            where = f"tool{i}"
            hoisted[where] = _rebased(arguments, f"#/$defs/{where}")
            arguments = {"$ref": f"#/$defs/{where}"}
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
    schema: dict[str, Any] = {"type": "array", "items": call, "minItems": 1, "maxItems": most}
    if hoisted:
        schema["$defs"] = hoisted
    return OutputConstraint(json_schema=json.dumps(schema), param=param)


def _rebased(schema: Any, base: str) -> Any:
    """`schema` with each of its `$ref`s (all within it: checked_schema) pointing at the
    same place once the schema itself is at `base`."""
    if isinstance(schema, list):
        return [_rebased(item, base) for item in schema]
    if not isinstance(schema, dict):
        return schema
    rebased = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str):
            rebased[key] = base + value[1:]
        elif key in _VALUE_KEYWORDS:
            rebased[key] = value
        else:
            rebased[key] = _rebased(value, base)
    return rebased


def from_responses_format(value: Any) -> OutputConstraint | None:
    """The Responses API's format: `text.format` (flat), or chat's `response_format`
    nesting, which OVMS accepts there too."""
    if isinstance(value, dict) and "json_schema" in value:
        return from_response_format(value)
    return from_text_format(value, "text.format")
