"""Data flow at the level of fields: where a tool's results came from, and the CEL functions that ask.

A tool's `labels` say where its whole result came from. `sources` says it finer
(docs/policy.md, "Field-level sources"):

```yaml
tools:
  list_files:
    labels: [untrusted]                # the rest of the result
    sources:
      fields:
        "files[].id": [drive_id]
        "files[].owner": [directory]
        "files[].content":                # chosen by the record (the file) holding it, first that holds
          - when: "record.owner == 'me@corp.example'"
            labels: [trusted]
          - labels: [untrusted]
  get_webpage:
    labels: [untrusted]
    sources:
      calls:                           # chosen by the call's arguments, first match wins
        - when: "from_user(args.url)"
          labels: [user_named]
      phrases: true                    # runs of words are indexed too
```

`ResultSources` is that entry compiled (`result_sources(policy, tool)`); the gate hands it, with the
call's arguments, to `ProvenanceIndex.add_result`, which asks it for the call's `ResultPlan`. A
`calls[].when` that cannot be evaluated gives the result every label the tool may carry (fail safe).

The functions conditions gain for it (registered with the rest of the catalogue, `proctor.policy.functions`, so
that every condition compiled knows them whether or not this module was imported):

- `field_provenance(value)`: the labels under which `value` appeared as a *whole* value of a result
  (a field, an item), never as a token inside longer text: a URL built on a host a page named is no
  hit, an id is one. For a list, the labels every item has.
- `field_paths(value)`: where it appeared whole, as ``TOOL:PATH`` (``list_files:files[].id``).
- `carries(value, label)` (or a list of labels): whether `value` holds anything from a source with that
  label, matched as `provenance()` matches: ``carries(args.body, 'private')``.
- `same_record(a, b)` (`same_record(a, b, tools)`): one record (the innermost map holding them) of a result of a
  tool with sources (of one of `tools`) held both as whole values; `same_call(a, b[, tools])`: one call's result
  did; `same_source(a, b)`: both appeared whole at one ``TOOL:PATH``.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from proctor.calls import Call
from proctor.policy._cel import cel
from proctor.policy.conditions import Condition, compile_expression
from proctor.policy.functions import FUNCTIONS
from proctor.policy.functions import RECORD_FUNCTIONS as _RECORD_FUNCTIONS
from proctor.policy.lets import expand
from proctor.policy.validators import FIELD_WHEN_VARIABLES, LABEL_WHEN_VARIABLES
from proctor.provenance import ProvenanceIndex, ResultPlan

if TYPE_CHECKING:
    from proctor.policy.engine import Policy
    from proctor.tools import Tool

__all__ = ["DATAFLOW_FUNCTIONS", "RECORD_FUNCTIONS", "ResultSources", "field_path_steps", "result_sources",
           "source_findings"]

#: The functions of this module: like `provenance()`, a policy calling one makes the gate keep the run's index.
DATAFLOW_FUNCTIONS = frozenset({"field_provenance", "field_paths", "carries", "same_record", "same_call",
                                "same_source"})
#: The functions whose optional third argument names tools (`policy check` checks a literal one names a tool with
#: sources: only those results have records); a policy calling one has the index keep records.
RECORD_FUNCTIONS = _RECORD_FUNCTIONS


def field_path_steps(path: str) -> tuple[str, ...]:
    """``files[].id`` -> ``('files', '[]', 'id')``; ``[].sender`` -> ``('[]', 'sender')`` (a valid path)."""
    steps: list[str] = []
    for part in path.split("."):
        key = part.split("[]", 1)[0]
        if key:
            steps.append(key)
        steps.extend("[]" for _ in range(part.count("[]")))
    return tuple(steps)


@dataclass(frozen=True, slots=True)
class _CallChoice:
    condition: Condition
    labels: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _FieldChoices:
    """One `sources.fields` path's choices, compiled: (condition or None for always, labels), in order."""

    choices: tuple[tuple[Condition | None, tuple[str, ...]], ...]


@dataclass(frozen=True, slots=True)
class _RecordLabels:
    """`_FieldChoices` for one call (a `FieldLabels`): chooses the labels of a value by the record holding it."""

    choices: _FieldChoices
    tool: str
    args: Mapping[str, Any]
    call: Call

    def labels_for(self, record: Mapping[str, Any] | None, otherwise: tuple[str, ...]) -> tuple[str, ...]:
        variables = {"record": dict(record) if record is not None else {}, "tool": self.tool, "args": self.args}
        for condition, labels in self.choices.choices:
            if condition is None:
                return labels
            try:
                holds = _evaluate(condition, variables, self.call)
            except _Failed:  # a record without the field the condition reads: no finer labels than the path's own
                return otherwise
            if holds:
                return labels
        return otherwise


class ResultSources:
    """One tool's `sources`, compiled: gives each call's result its `ResultPlan` (a `ResultLabeller`)."""

    __slots__ = ("calls", "every", "fields", "phrases", "records", "result")

    def __init__(self, result: tuple[str, ...], fields: Mapping[str, tuple[str, ...] | _FieldChoices],
                 calls: tuple[_CallChoice, ...], phrases: bool, every: tuple[str, ...], records: bool = False) -> None:
        self.result = result
        self.fields = tuple((field_path_steps(path), labels) for path, labels in fields.items())
        self.calls = calls
        self.phrases = phrases
        #: Every label the tool's results may carry: what a call whose condition fails is indexed under.
        self.every = every
        #: Whether the index keeps this tool's records (the policy reads them: `same_record`, `same_call`).
        self.records = records

    def plan(self, tool: str, args: Mapping[str, Any], index: ProvenanceIndex) -> ResultPlan:
        """The labels of this call's result: the first `calls` entry whose condition holds chooses those of the
        rest of the result; a condition that fails makes them every label the tool may carry."""
        result = self.result
        call = Call(tool, dict(args), provenance=index)
        if self.calls:
            variables = {"tool": tool, "args": dict(args)}
            for choice in self.calls:
                try:
                    holds = _evaluate(choice.condition, variables, call)
                except _Failed:
                    result = self.every
                    break
                if holds:
                    result = choice.labels
                    break
        fields = tuple((steps, labels if isinstance(labels, tuple) else _RecordLabels(labels, tool, dict(args), call))
                       for steps, labels in self.fields)
        return ResultPlan(result, fields, self.phrases, self.records)


class _Failed(Exception):
    """A `calls[].when` that could not be evaluated for this call."""


def _evaluate(condition: Condition, variables: Mapping[str, Any], call: Call) -> bool:
    try:  # (a record CEL cannot take, a set or an object in it, fails the condition too)
        context = cel.Context({name: variables[name] for name in condition.variables})
        for fn in condition.functions:
            context.add_function(fn, FUNCTIONS[fn].callable_for(call))
        value = condition.program.execute(context)
    except Exception as exc:  # noqa: BLE001 - any failure of the condition is a failure: fail safe
        raise _Failed(str(exc)) from None
    if not isinstance(value, bool):
        raise _Failed(f"gave {value!r}, not true or false")
    return value


_COMPILED: weakref.WeakKeyDictionary[Policy, dict[str, ResultSources | None]] = weakref.WeakKeyDictionary()


def result_sources(policy: Policy, tool: str) -> ResultSources | None:
    """The compiled `sources` of `tool` in `policy` (None when it has none), compiled once per policy."""
    per_tool = _COMPILED.get(policy)
    if per_tool is None:
        per_tool = _COMPILED[policy] = {}
    if tool not in per_tool:
        spec = policy.model.tools.get(tool)
        sources = spec.sources if spec is not None else None
        if sources is None:
            per_tool[tool] = None
        else:
            calls = tuple(
                _CallChoice(compile_expression(expand(c.when, policy.lets), LABEL_WHEN_VARIABLES, "when"),
                            tuple(c.labels))
                for c in sources.calls)
            fields: dict[str, tuple[str, ...] | _FieldChoices] = {}
            for path, given in sources.fields.items():
                labels = [label for label in given if isinstance(label, str)]
                if len(labels) == len(given):
                    fields[path] = tuple(labels)
                else:  # choices by record (the schema holds a path's value as labels only, or as choices only)
                    fields[path] = _FieldChoices(tuple(
                        (None if c.when is None
                         else compile_expression(expand(c.when, policy.lets), FIELD_WHEN_VARIABLES, "when"),
                         tuple(c.labels))
                        for c in given if not isinstance(c, str)))
            chosen = [c.condition for c in calls] + [condition for f in fields.values()
                                                     if isinstance(f, _FieldChoices)
                                                     for condition, _ in f.choices if condition is not None]
            records = policy.uses_records or any(RECORD_FUNCTIONS.intersection(c.functions) for c in chosen)
            per_tool[tool] = ResultSources(tuple(sources.result), fields, calls, bool(sources.phrases),
                                           tuple(spec.labels) if spec is not None else (), records)
    return per_tool[tool]


# -- policy check: paths against the tools' result types -------------------------------------------------------


def source_findings(policy: Policy, tools: Mapping[str, Tool]) -> list[tuple[tuple[Any, ...], str]]:
    """(location, message) for each `sources.fields` path the tool's declared result type has no place for
    (checked only for tools whose result type is known: a return annotation other than Any)."""
    out: list[tuple[tuple[Any, ...], str]] = []
    for name, spec in policy.model.tools.items():
        sources = spec.sources
        tool = tools.get(name)
        if sources is None or tool is None or not sources.fields:
            continue
        schema = _result_schema(tool)
        if schema is None:
            continue
        for path in sources.fields:
            problem = _walk(schema, schema, field_path_steps(path))
            if problem is not None:
                out.append((("tools", name, "sources", "fields", path),
                            f"tool '{name}': sources.fields '{path}': {problem}"))
    return out


def _result_schema(tool: Tool) -> dict[str, Any] | None:
    import inspect

    import pydantic

    annotation = tool.signature.return_annotation
    if annotation is inspect.Signature.empty or annotation is Any:
        return None
    try:
        schema: dict[str, Any] = pydantic.TypeAdapter(annotation).json_schema()
    except Exception:  # noqa: BLE001 - a type pydantic cannot describe: nothing to check against
        return None
    return schema


def _resolve(root: Mapping[str, Any], node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The schemas `node` may be: $ref followed, anyOf/oneOf/allOf branches spread."""
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        target = root.get("$defs", {}).get(ref.removeprefix("#/$defs/"))
        return _resolve(root, target) if isinstance(target, Mapping) else [{}]
    branches = [b for key in ("anyOf", "oneOf", "allOf") for b in node.get(key, ()) if isinstance(b, Mapping)]
    if branches:
        return [r for b in branches for r in _resolve(root, b) if r.get("type") != "null"]
    return [node]


def _walk(root: Mapping[str, Any], node: Mapping[str, Any], steps: tuple[str, ...]) -> str | None:
    """None when some schema `node` may be has a place at `steps`, else why not."""
    if not steps:
        return None
    step, rest = steps[0], steps[1:]
    problems: list[str] = []
    for option in _resolve(root, node):
        if not option or (option.get("type") is None and not option.get("properties")):
            return None  # any value (Any, an untyped dict): cannot say
        kind = option.get("type")
        if step == "[]":
            if kind == "array":
                items = option.get("items", {})
                found = _walk(root, items if isinstance(items, Mapping) else {}, rest)
                if found is None:
                    return None
                problems.append(found)
            else:
                problems.append(f"'[]' but the value there is {kind or 'not a list'}, not a list")
            continue
        if kind != "object":
            problems.append(f"'{step}' but the value there is {kind}, not an object")
            continue
        props = option.get("properties", {})
        extra = option.get("additionalProperties")
        if step == "*":
            children = [*props.values(), *([extra] if isinstance(extra, Mapping) else [])]
            if not children or any(_walk(root, c, rest) is None for c in children):
                return None
            problems.append(f"no key of the object there leads to '{'.'.join(rest)}'")
        elif step in props:
            found = _walk(root, props[step], rest)
            if found is None:
                return None
            problems.append(found)
        elif isinstance(extra, Mapping):
            found = _walk(root, extra, rest)
            if found is None:
                return None
            problems.append(found)
        else:
            problems.append(f"no field '{step}' in the result there (fields: {', '.join(sorted(props)) or 'none'})")
    return problems[0] if problems else None
