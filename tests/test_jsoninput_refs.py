"""`unresolved_reference`: every `$ref` of a schema looked up once, as validation would (within the schema and the
meta-schemas, nothing fetched), so a tool whose schema would refuse every call is found before any call."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from proctor.jsoninput import local_schema_validator, reference_cycle, unresolved_reference

DEFS = {"$defs": {"a": {"type": "string"}}}


@pytest.mark.parametrize(("schema", "found"), [
    ({"properties": {"x": {"$ref": "#/$defs/a"}}, **DEFS}, None),
    ({"properties": {"x": {"$ref": "#/$defs/missing"}}, **DEFS}, ("/properties/x", "#/$defs/missing")),
    ({"properties": {"x": {"$ref": "http://169.254.169.254/latest"}}}, ("/properties/x", "http://169.254.169.254/latest")),
    ({"properties": {"x": {"$ref": "other.json"}}}, ("/properties/x", "other.json")),
    # relative to the schema's own remote $id: resolved within the schema when it points into it, never fetched
    ({"$id": "http://internal/s.json", "properties": {"x": {"$ref": "#/properties/y"}, "y": {}}}, None),
    ({"$id": "http://internal/s.json", "properties": {"x": {"$ref": "t.json"}}}, ("/properties/x", "t.json")),
    ({"properties": {"x": {"$ref": "https://json-schema.org/draft/2020-12/schema"}}}, None),  # a meta-schema
    ({"properties": {"x": {"$ref": "#nowhere"}}}, ("/properties/x", "#nowhere")),
    ({"properties": {"x": {"$dynamicRef": "#nowhere"}}}, ("/properties/x", "#nowhere")),
    ({"properties": {"x": {"$ref": "http://[bad"}}}, ("/properties/x", "http://[bad")),
    ({"properties": {"x": {"prefixItems": [{"$ref": "#/$defs/no"}]}}}, ("/properties/x/prefixItems/0", "#/$defs/no")),
    ({"properties": {"x": {"enum": [{"$ref": "nowhere"}]}}}, None),  # data, not a schema
    ({"properties": {"$ref": {"type": "string"}}}, None),  # a property named $ref
    ({"$schema": "http://json-schema.org/draft-07/schema#", "properties": {"x": {"$ref": "#/definitions/b"}},
      "definitions": {"a": {}}}, ("/properties/x", "#/definitions/b")),
])
def test_each_reference_is_looked_up_as_validation_would(schema: dict[str, Any], found: tuple[str, str] | None) -> None:
    schema = {"type": "object", **schema}
    checker = local_schema_validator(schema)
    checker.check_schema(schema)
    assert unresolved_reference(schema, type(checker)) == found


def test_what_it_finds_is_what_validation_refuses_and_what_it_passes_validates() -> None:
    import referencing.exceptions

    missing = {"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}
    with pytest.raises(referencing.exceptions.Unresolvable):
        list(local_schema_validator(missing).iter_errors({"x": 1}))
    fine = {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, **DEFS}
    assert unresolved_reference(fine) is None
    assert [e.message for e in local_schema_validator(fine).iter_errors({"x": 1})] == ["1 is not of type 'string'"]


def test_a_schema_nested_beyond_pythons_stack_is_walked_without_recursion() -> None:
    deep: dict[str, Any] = {"$ref": "#/$defs/missing"}
    for _ in range(5000):
        deep = {"not": deep}
    assert unresolved_reference(deep, jsonschema.Draft202012Validator) == ("/not" * 5000, "#/$defs/missing")


NODE = {"$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}}}


@pytest.mark.parametrize(("schema", "found"), [
    ({"properties": {"x": {"$ref": "#/properties/x"}}}, ("/properties/x", "#/properties/x")),
    ({"properties": {"x": {"$ref": "#/$defs/a"}}, "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}},
     ("/$defs/a", "#/$defs/b")),
    ({"allOf": [{"$ref": "#"}]}, ("/allOf/0", "#")),
    ({"anyOf": [{"type": "string"}, {"not": {"$ref": "#"}}]}, ("/anyOf/1/not", "#")),
    ({"if": {"$ref": "#"}}, ("/if", "#")),
    ({"dependentSchemas": {"k": {"$ref": "#"}}}, ("/dependentSchemas/k", "#")),
    ({"$id": "http://internal/s.json", "properties": {"x": {"$ref": "s.json#/properties/x"}}},
     ("/properties/x", "s.json#/properties/x")),
    ({"$schema": "http://json-schema.org/draft-07/schema#", "properties": {"x": {"$ref": "#/definitions/a"}},
      "definitions": {"a": {"$ref": "#/definitions/a"}}}, ("/definitions/a", "#/definitions/a")),
    # recursion into the value ends with it: no cycle
    ({"properties": {"node": {"$ref": "#/$defs/Node"}}, **NODE}, None),
    ({"properties": {"x": {"items": {"$ref": "#/properties/x"}}}}, None),
    ({"properties": {"x": {"$ref": "#/$defs/a"}}, **DEFS}, None),
    ({"properties": {"x": {"$ref": "https://json-schema.org/draft/2020-12/schema"}}}, None),  # a meta-schema
    ({"$defs": {"a": {"$dynamicAnchor": "n", "properties": {"k": {"$dynamicRef": "#n"}}}},
      "properties": {"x": {"$ref": "#/$defs/a"}}}, None),
])
def test_a_reference_cycle_is_found_where_validation_would_recurse_without_end(
        schema: dict[str, Any], found: tuple[str, str] | None) -> None:
    schema = {"type": "object", **schema}
    checker = local_schema_validator(schema)
    checker.check_schema(schema)
    assert unresolved_reference(schema, type(checker)) is None
    assert reference_cycle(schema, type(checker)) == found
    instance = {"x": {"k": {}}, "node": {"next": {"next": {}}}, "k": 1}
    if found is None:  # what it passes validates (a verdict, not a RecursionError)
        list(checker.iter_errors(instance))
    else:
        # Python's stack runs out where it runs out: in jsonschema (RecursionError), or inside the registry's Rust
        # map (rpds), which turns the RecursionError it is handed into a panic naming it.
        with pytest.raises(BaseException) as info:
            list(checker.iter_errors(instance))
        assert isinstance(info.value, RecursionError) or (
            type(info.value).__name__ == "PanicException" and "RecursionError" in str(info.value)), repr(info.value)


def test_a_cycle_is_looked_for_without_recursion() -> None:
    deep: dict[str, Any] = {"$ref": "#"}
    for _ in range(5000):
        deep = {"not": deep}
    assert reference_cycle(deep, jsonschema.Draft202012Validator) == ("/not" * 5000, "#")
