"""JSON from people and models (command-line options, console edits, tool-call arguments), bounded.

`json.loads` recurses once per nesting level: 50,000 ``[`` end in a `RecursionError`
that escapes every ``except ValueError``. `loads_bounded` measures size and depth
first, in one pass over the text that skips strings, and refuses with a located
`ConfigurationError` (a `ValueError`): ``--args:1:65: JSON nested deeper than 64 levels``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from proctor.errors import ConfigurationError

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

__all__ = ["MAX_JSON_INPUT_BYTES", "MAX_JSON_INPUT_DEPTH", "PATTERN_TIMEOUT_S", "loads_bounded",
           "local_schema_validator", "reference_cycle", "regex_keywords", "shape_problem", "unbounded_pattern_use",
           "unresolved_reference"]

MAX_JSON_INPUT_DEPTH = 64
MAX_JSON_INPUT_BYTES = 4 << 20

# A JSON string (with its escapes) or one bracket: strings are skipped whole, so a
# bracket inside one is not counted.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]', re.DOTALL)


def _where(text: str, index: int) -> str:
    line = text.count("\n", 0, index) + 1
    return f"{line}:{index - (text.rfind(chr(10), 0, index) + 1) + 1}"


def shape_problem(text: str, what: str = "JSON", *, max_depth: int = MAX_JSON_INPUT_DEPTH,
                  max_bytes: int = MAX_JSON_INPUT_BYTES) -> str | None:
    """Why `text` is too big or too deeply nested to parse (``WHAT:LINE:COLUMN: …``), or None."""
    if len(text) > max_bytes or len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        return f"{what}:1:1: JSON input over {max_bytes} bytes; pass less"
    depth = 0
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            if depth > max_depth:
                return f"{what}:{_where(text, match.start())}: JSON nested deeper than {max_depth} levels; flatten it"
        elif token in ("]", "}"):
            depth -= 1
    return None


def loads_bounded(text: str, what: str = "JSON", *, max_depth: int = MAX_JSON_INPUT_DEPTH,
                  max_bytes: int = MAX_JSON_INPUT_BYTES) -> Any:
    """`json.loads(text)`, refusing text over `max_bytes` or nested deeper than `max_depth`.

    Every refusal — too big, too deep, not JSON — is a `ConfigurationError` whose message
    starts with ``WHAT:LINE:COLUMN:``.
    """
    problem = shape_problem(text, what, max_depth=max_depth, max_bytes=max_bytes)
    if problem is not None:
        raise ConfigurationError(problem)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"{what}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None
    except RecursionError:  # pragma: no cover - the depth check comes first; kept as a last guard
        raise ConfigurationError(f"{what}:1:1: JSON nested too deeply; flatten it") from None


def local_schema_validator(schema: Mapping[str, Any], draft: type[Validator] | None = None) -> Validator:
    """A jsonschema validator for `schema` (of `draft`, else the one its ``$schema`` names) that resolves a
    ``$ref`` only within the schema itself and the JSON Schema meta-schemas.

    jsonschema's default fetches any other reference over the network (``http://…``, or one relative to a
    remote ``$id``), and a tool's schema is often someone else's (an MCP server's): it would aim proctor's
    process at an internal host. Validating against such a reference raises
    `referencing.exceptions.Unresolvable` (its ``ref`` names it). Its regular expressions are checked within
    `PATTERN_TIMEOUT_S` (`_bounded_patterns`). Needs jsonschema and regex (ImportError otherwise).
    """
    import jsonschema
    from referencing import Registry

    kind: type[Validator] = draft if draft is not None else jsonschema.validators.validator_for(schema)
    return _bounded_patterns(kind)(schema, registry=Registry())


#: How long checking one string against a schema's regular expression (``pattern``, a ``patternProperties`` key)
#: may take: a pattern that backtracks without end (``^(a+)+$`` on 30 characters takes Python's `re` minutes,
#: holding the GIL) refuses the value instead of stalling the process.
PATTERN_TIMEOUT_S = 0.1


class _SlowPattern(Exception):
    pass


def _search(pattern: str, text: str) -> bool:
    """`re.search` as jsonschema calls it, in the `regex` engine, bounded by `PATTERN_TIMEOUT_S`."""
    import regex

    try:
        return regex.search(pattern, text, timeout=PATTERN_TIMEOUT_S) is not None
    except TimeoutError:
        raise _SlowPattern from None


def _bounded_patterns(kind: type[Validator]) -> type[Validator]:
    """`kind` with its regular-expression keywords checked by `_search`: ``pattern``, ``patternProperties`` and
    ``additionalProperties`` beside ``patternProperties`` (jsonschema's own use Python's `re`, unbounded), with
    jsonschema's messages. (``unevaluatedProperties`` beside ``patternProperties`` still uses `re`:
    `unbounded_pattern_use` finds a schema that combines them.)"""
    made = _BOUNDED.get(kind)
    if made is not None:
        return made
    import jsonschema
    import regex  # noqa: F401 - missing: an ImportError before any value is checked, not at the first pattern
    from jsonschema.exceptions import ValidationError

    base = kind.VALIDATORS

    def slow(pattern: str, text: str) -> ValidationError:
        return ValidationError(f"{text[:80]!r} could not be checked against the pattern {pattern[:80]!r} within "
                               f"{PATTERN_TIMEOUT_S:g}s (a pattern that backtracks without end): refused")

    def pattern(validator: Any, patrn: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
        if validator.is_type(instance, "string"):
            try:
                if not _search(patrn, instance):
                    yield ValidationError(f"{instance!r} does not match {patrn!r}")
            except _SlowPattern:
                yield slow(patrn, instance)

    def pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
        if not validator.is_type(instance, "object"):
            return
        for patrn, subschema in patterns.items():
            for key, value in instance.items():
                try:
                    matched = _search(patrn, key)
                except _SlowPattern:
                    yield slow(patrn, key)
                    continue
                if matched:
                    yield from validator.descend(value, subschema, path=key, schema_path=patrn)

    def additional_properties(validator: Any, aP: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
        if "patternProperties" not in schema or not validator.is_type(instance, "object"):
            yield from base["additionalProperties"](validator, aP, instance, schema)
            return
        properties, joined = schema.get("properties", {}), "|".join(schema["patternProperties"])
        extras = []
        for key in instance:
            try:
                if key in properties or (joined and _search(joined, key)):
                    continue
            except _SlowPattern:
                yield slow(joined, key)
                return
            extras.append(key)
        if validator.is_type(aP, "object"):
            for extra in extras:
                yield from validator.descend(instance[extra], aP, path=extra)
        elif not aP and extras:
            verb = "does" if len(extras) == 1 else "do"
            keys = ", ".join(repr(each) for each in sorted(extras))
            patterns = ", ".join(repr(each) for each in sorted(schema["patternProperties"]))
            yield ValidationError(f"{keys} {verb} not match any of the regexes: {patterns}")

    bounded: type[Validator] = jsonschema.validators.extend(kind, {
        "pattern": pattern, "patternProperties": pattern_properties, "additionalProperties": additional_properties})
    _BOUNDED[kind] = bounded
    return bounded


_BOUNDED: dict[Any, type[Validator]] = {}  # one class per draft (jsonschema's `extend` makes a new one each time)


def _as_resource(schema: Mapping[str, Any], draft: type[Validator] | None) -> Any:
    """`schema` as a `referencing` resource of its dialect (`draft`'s, else the one its ``$schema`` names): what
    its subschemas are walked from."""
    import jsonschema
    import referencing.jsonschema
    from referencing import Specification

    kind = draft if draft is not None else jsonschema.validators.validator_for(schema)
    dialect = kind.ID_OF(kind.META_SCHEMA) or "urn:unknown-dialect"
    return referencing.jsonschema.specification_with(dialect, default=Specification.OPAQUE).create_resource(schema)


def regex_keywords(schema: Mapping[str, Any], draft: type[Validator] | None = None) -> frozenset[str]:
    """Which of ``pattern``, ``patternProperties`` and ``unevaluatedProperties`` `schema`'s subschemas use (walked
    as `unresolved_reference` walks them: keywords that hold data, names of properties, are not read)."""
    found: set[str] = set()
    stack = [_as_resource(schema, draft)]
    while stack:
        resource = stack.pop()
        contents = resource.contents
        if isinstance(contents, Mapping):
            found.update(k for k in ("pattern", "patternProperties", "unevaluatedProperties") if k in contents)
        stack.extend(resource.subresources())
    return frozenset(found)


def unbounded_pattern_use(schema: Mapping[str, Any], draft: type[Validator] | None = None) -> str | None:
    """Why `schema`'s regular expressions cannot all be checked in bounded time by `local_schema_validator`, or
    None: it has both ``unevaluatedProperties`` and ``patternProperties`` (jsonschema then matches keys with
    Python's `re`, which nothing bounds)."""
    if {"unevaluatedProperties", "patternProperties"} <= regex_keywords(schema, draft):
        return ("it combines unevaluatedProperties with patternProperties, whose keys proctor cannot check in "
                "bounded time (a pattern that backtracks without end would stall the process)")
    return None


def unresolved_reference(schema: Mapping[str, Any], draft: type[Validator] | None = None) -> tuple[str, str] | None:
    """The first ``$ref`` (or ``$dynamicRef``) of `schema` that `local_schema_validator` cannot resolve, as
    ``(where, ref)`` — `where` the JSON pointer of the subschema holding it (``/properties/x``) — or None.

    Validation finds such a reference only when an instance reaches it, so a schema that refers to a
    missing ``#/$defs/x``, or to anything outside itself, would be refused call after call. This looks
    every reference up once, as validation would: within the schema and the meta-schemas only (the same
    registry, which retrieves nothing), base URIs following each subschema's ``$id``. Subschemas are
    walked without recursion (a schema nested beyond Python's stack is still answered); keywords that
    hold data (``enum``, ``const``, ``default``) are not schemas and are not read. `schema` must already
    pass ``check_schema``. Needs jsonschema (ImportError otherwise).
    """
    from jsonschema_specifications import REGISTRY as META_SCHEMAS
    from referencing import Registry
    from referencing.exceptions import Unresolvable

    registry = META_SCHEMAS.combine(Registry())  # what jsonschema makes of local_schema_validator's Registry()
    root = _as_resource(schema, draft)
    where = _pointers(schema)
    stack = [(root, registry.resolver_with_root(root))]
    while stack:
        resource, resolver = stack.pop()
        contents = resource.contents
        if isinstance(contents, Mapping):
            for key in ("$ref", "$dynamicRef"):
                ref = contents.get(key)
                if not isinstance(ref, str):
                    continue
                try:
                    resolver.lookup(ref)
                except (Unresolvable, ValueError):  # ValueError: no URI at all (``http://[x``), so nowhere
                    return where.get(id(contents), ""), ref
        for sub in reversed(list(resource.subresources())):
            try:
                stack.append((sub, resolver.in_subresource(sub)))
            except ValueError:  # its ``$id`` is no URI: no reference under it can be resolved
                held = sub.contents
                ident = held.get("$id", held.get("id")) if isinstance(held, Mapping) else None
                return where.get(id(held), ""), str(ident)
    return None


#: The keywords that apply their subschemas to the very instance their schema validates (no step into it).
_IN_PLACE_ONE = ("not", "if", "then", "else")
_IN_PLACE_MANY = ("allOf", "anyOf", "oneOf", "extends")
_IN_PLACE_BY_NAME = ("dependentSchemas", "dependencies")
_REFERENCES = ("$ref", "$dynamicRef", "$recursiveRef")


def reference_cycle(schema: Mapping[str, Any], draft: type[Validator] | None = None) -> tuple[str, str] | None:
    """A ``$ref`` of `schema` that leads back to where it is without stepping into the instance, as ``(where, ref)``
    (as `unresolved_reference` says them), or None.

    ``{"properties": {"x": {"$ref": "#/properties/x"}}}``, or ``a`` referring to ``b`` and ``b`` to ``a``:
    validation applies the schema to the same value again and again, until Python's stack runs out (a
    `RecursionError` on every instance that reaches it). A schema that recurses into a part of the
    instance (a tree: ``next`` of a ``Node`` is a ``Node``) ends with the instance and is no cycle. Found
    by following, from every subschema, its references and the keywords that apply to the same
    instance (``allOf``, ``anyOf``, ``oneOf``, ``not``, ``if``/``then``/``else``, ``dependentSchemas``)
    without recursion. `schema` must already pass `unresolved_reference`. Needs jsonschema.
    """
    from jsonschema_specifications import REGISTRY as META_SCHEMAS
    from referencing import Registry
    from referencing.exceptions import Unresolvable

    root = _as_resource(schema, draft)
    where = _pointers(schema)
    # Each subschema (by identity): the subschemas validation applies to the same instance, and its reference.
    then: dict[int, list[int]] = {}
    refs: dict[int, str] = {}
    stack = [(root, META_SCHEMAS.combine(Registry()).resolver_with_root(root))]
    while stack:
        resource, resolver = stack.pop()
        contents = resource.contents
        if isinstance(contents, Mapping):
            nexts = then.setdefault(id(contents), [])
            for key in _REFERENCES:
                ref = contents.get(key)
                if isinstance(ref, str):
                    try:
                        target = resolver.lookup(ref).contents
                    except (Unresolvable, ValueError):
                        continue  # (said by unresolved_reference)
                    nexts.append(id(target))
                    refs.setdefault(id(contents), ref)
            held = [contents.get(key) for key in _IN_PLACE_ONE]
            held += [sub for key in _IN_PLACE_MANY if isinstance(many := contents.get(key), list) for sub in many]
            held += [sub for key in _IN_PLACE_BY_NAME if isinstance(named := contents.get(key), Mapping)
                     for sub in named.values()]
            nexts.extend(id(sub) for sub in held if isinstance(sub, Mapping))
        try:
            stack.extend((sub, resolver.in_subresource(sub)) for sub in resource.subresources())
        except ValueError:  # an `$id` that is no URI (said by unresolved_reference)
            continue
    # A path of such steps that comes back to a subschema on it: depth-first, without recursion.
    done: set[int] = set()
    for start in sorted(then, key=lambda node: where.get(node, "")):  # (the walk's order follows string hashes)
        if start in done:
            continue
        path, on_path = [start], {start}
        ahead = [iter(then.get(start, ()))]
        while ahead:
            step = next(ahead[-1], None)
            if step is None:
                finished = path.pop()
                on_path.discard(finished)
                done.add(finished)
                ahead.pop()
                continue
            if step in on_path:
                cycle = path[path.index(step):]
                node = min((n for n in cycle if n in refs), key=lambda n: where.get(n, ""), default=cycle[0])
                return where.get(node, ""), refs.get(node, "")
            if step not in done:
                path.append(step)
                on_path.add(step)
                ahead.append(iter(then.get(step, ())))
    return None


def _pointers(value: Any) -> dict[int, str]:
    """The JSON pointer of every object and array in `value`, by identity (walked without recursion)."""
    found: dict[int, str] = {}
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        node, at = stack.pop()
        if isinstance(node, Mapping):
            found.setdefault(id(node), at)
            stack.extend((v, f"{at}/{str(k).replace('~', '~0').replace('/', '~1')}") for k, v in node.items())
        elif isinstance(node, list):
            found.setdefault(id(node), at)
            stack.extend((v, f"{at}/{i}") for i, v in enumerate(node))
    return found
