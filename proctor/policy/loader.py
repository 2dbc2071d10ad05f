"""Load a policy file, reporting every problem at once with its line and column.

YAML is composed into nodes (PyYAML's safe composer keeps each node's marks) and
turned into plain data by hand, so duplicate keys are caught and every key and value
keeps its position, indexed by its path (``("rules", 2, "match", "tool")``). The data
is then validated by the pydantic models of `proctor.policy.schema` (or, for `proctor policy
check`, by their compiled core schema without importing pydantic: `proctor.policy.fastcheck`),
and each validation error is mapped back through its path to a position in the file.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import yaml
from pydantic_core import ValidationError

from proctor.errors import PolicyError, PolicyIssue
from proctor.policy._core_schema import FIELDS
from proctor.policy.yamlsafe import check_yaml

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

    from proctor.policy.schema import PolicyModel

__all__ = ["Loc", "Marks", "compose_marked", "load_policy_marked", "load_policy_text", "validate_policy_data"]

Loc = tuple[str | int, ...]
_SKIP = object()  # a node that could not be constructed (already reported)
# Errors whose message already names what is wrong; others get the field path prefixed.
_SELF_DESCRIBING = {"choice", "cel", "let", "empty_match", "empty_limit", "version", "scoped_model_limit", "durability",
                    "cost", "per_window"}
# Our own error types: their message is complete, no pydantic "got …" suffix.
_CUSTOM = {*_SELF_DESCRIBING, "duration", "tool_name", "empty"}


@dataclass
class Marks:
    """1-based positions of every key and value of a composed document, by path."""

    text: str = ""
    keys: dict[Loc, tuple[int, int]] = field(default_factory=dict)
    values: dict[Loc, tuple[int, int]] = field(default_factory=dict)
    nodes: dict[Loc, yaml.Node] = field(default_factory=dict)

    def value_at(self, loc: Loc) -> tuple[int, int]:
        """Position of the value at `loc`, or of its nearest enclosing value."""
        while loc not in self.values and loc:
            loc = loc[:-1]
        return self.values.get(loc, (1, 1))


def _yaml_hint(problem: str, text: str, line: int) -> str:
    """What to do about a YAML syntax error ops commonly make."""
    if "'\\t'" in problem or "\t" in problem:
        return " (indent with spaces, not tabs)"
    if "mapping values are not allowed" in problem:
        lines = text.splitlines()
        current = lines[line - 1].lstrip() if 0 < line <= len(lines) else ""
        if current.startswith(("when:", "cost:", "- when:")):
            return " (': ' inside a condition ends the YAML value: quote the CEL expression)"
        return " (quote a value that contains ': ')"
    return ""


def _pos(mark: yaml.Mark) -> tuple[int, int]:
    return mark.line + 1, mark.column + 1


def compose_marked(text: str, source: str) -> tuple[Any, Marks, list[PolicyIssue]]:
    """Parse YAML `text` into plain data plus the `Marks` of each path; YAML problems become issues.

    The one YAML loader of proctor (policies, cases files): `proctor.policy.yamlsafe` limits
    apply to every document it reads.
    """
    marks = Marks(text=text)
    # Size, depth and expanded size first: an alias bomb is refused before anything is built.
    issues: list[PolicyIssue] = check_yaml(text, source)
    if issues:
        return None, marks, issues
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        line, col = _pos(exc.problem_mark) if exc.problem_mark else (1, 1)
        problem = exc.problem or "invalid YAML"
        context = f" {exc.context}" if exc.context else ""
        hint = _yaml_hint(problem, text, line)
        issues.append(PolicyIssue(source, line, col, f"YAML syntax error: {problem}{context}{hint}"))
        return None, marks, issues
    except yaml.YAMLError as exc:
        issues.append(PolicyIssue(source, 1, 1, f"YAML error: {exc}"))
        return None, marks, issues
    if root is None:
        return None, marks, issues
    constructor = yaml.constructor.SafeConstructor()
    active: set[int] = set()

    def build(node: yaml.Node, loc: Loc) -> Any:
        marks.values[loc] = _pos(node.start_mark)
        marks.nodes[loc] = node
        if id(node) in active:
            issues.append(PolicyIssue(source, *_pos(node.start_mark), "recursive YAML alias"))
            return None
        if isinstance(node, yaml.MappingNode):
            active.add(id(node))
            out: dict[str, Any] = {}
            seen: dict[str, tuple[int, int]] = {}
            for key_node, value_node in node.value:
                where = _pos(key_node.start_mark)
                key = _scalar(key_node)
                if key is _SKIP:
                    continue
                if not isinstance(key, str):
                    issues.append(PolicyIssue(source, *where, f"keys must be plain strings, got {key!r}"))
                    continue
                if key in seen:
                    issues.append(PolicyIssue(source, *where, f"duplicate key '{key}' (first at line {seen[key][0]})"))
                    continue
                seen[key] = where
                child: Loc = (*loc, key)
                marks.keys[child] = where
                out[key] = build(value_node, child)
            active.discard(id(node))
            return out
        if isinstance(node, yaml.SequenceNode):
            active.add(id(node))
            items = [build(item, (*loc, i)) for i, item in enumerate(node.value)]
            active.discard(id(node))
            return items
        return _scalar(node)

    def _scalar(node: yaml.Node) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            return node  # a complex key: reported by the caller as not a string
        if node.tag == "tag:yaml.org,2002:merge":
            issues.append(PolicyIssue(source, *_pos(node.start_mark), "YAML merge keys (<<) are not supported"))
            return _SKIP
        try:
            return constructor.construct_object(node)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            hint = ""
            if node.tag.startswith("!") and not node.tag.startswith("!!"):
                hint = (f" (a value starting with '!' is a YAML tag: quote the CEL expression, "
                        f"e.g. \"{node.tag}{' ' + node.value if node.value else ''}\")")
            issues.append(PolicyIssue(source, *_pos(node.start_mark), f"YAML error: {problem}{hint}"))
            return _SKIP

    return build(root, ()), marks, issues


def load_policy_text(text: str, source: str, *, fast: bool = False) -> PolicyModel:
    """Parse and validate a policy file's text; raises PolicyError listing every issue.

    `fast`: validate without importing pydantic (`proctor.policy.fastcheck`): the same checks and
    errors, but the result is made of plain records with the models' fields, not the models.
    """
    return load_policy_marked(text, source, fast=fast)[0]


def load_policy_marked(text: str, source: str, *, fast: bool = False) -> tuple[PolicyModel, Marks]:
    """`load_policy_text`, with the positions of the text's keys and values (for `proctor.policy.lint`)."""
    data, marks, issues = compose_marked(text, source)
    if issues and data is None:
        raise PolicyError(issues)
    try:
        model = validate_policy_data(data, source, marks, fast=fast)
    except PolicyError as exc:
        # A value YAML could not build is reported once, by YAML (not again as "should be a string").
        broken = {(i.line, i.column) for i in issues}
        issues.extend(i for i in exc.issues if (i.line, i.column) not in broken or "should be" not in i.message)
    if issues:
        raise PolicyError(sorted(issues, key=lambda i: (i.line, i.column)))
    return model, marks


def validate_policy_data(data: Any, source: str, marks: Marks | None = None, *, fast: bool = False) -> PolicyModel:
    """Validate plain data (from YAML, or a dict) into a PolicyModel; raises PolicyError listing every issue.

    Without `marks` (a dict given in code) issues are at line 0, column 0 and name the path instead.
    `fast`: as `load_policy_text`'s.
    """
    if data is None:
        raise PolicyError(PolicyIssue(source, 1, 1, "empty policy: a policy starts with `version: 1`"))
    if not isinstance(data, Mapping):
        where = marks.value_at(()) if marks else (0, 0)
        raise PolicyError(
            PolicyIssue(source, *where, "a policy is a mapping (version, default, tools, budgets, rules)")
        )
    issues = _duplicate_names(data, source, marks)
    try:
        model = _validate(dict(data), fast)
    except ValidationError as exc:
        issues.extend(_issue(err, data, source, marks) for err in exc.errors(include_url=False))
    if issues:
        raise PolicyError(sorted(issues, key=lambda i: (i.line, i.column)))
    return model


def _validate(data: dict[str, Any], fast: bool) -> PolicyModel:
    if fast:
        from proctor.policy.fastcheck import validate

        return validate(data)
    from proctor.policy.schema import PolicyModel

    return PolicyModel.model_validate(data)


def _duplicate_names(data: Mapping[str, Any], source: str, marks: Marks | None) -> list[PolicyIssue]:
    issues = []
    for section, noun in (("rules", "rule"), ("budgets", "budget")):
        items = data.get(section)
        if not isinstance(items, list):
            continue
        first: dict[str, int] = {}
        for i, item in enumerate(items):
            name = item.get("name") if isinstance(item, Mapping) else None
            if not isinstance(name, str):
                continue
            if name in first:
                j = first[name]
                was = f"line {marks.value_at((section, j))[0]}" if marks else f"{section}[{j}]"
                where = marks.value_at((section, i, "name")) if marks else (0, 0)
                issues.append(PolicyIssue(source, *where, f"{noun} '{name}': duplicate {noun} name (first at {was})"))
            else:
                first[name] = i
    return issues


def _keys_at(loc: Loc) -> tuple[str, ...] | None:
    """The keys of the model that lives at `loc` (for did-you-mean on unknown keys)."""
    n, head = len(loc), loc[0] if loc else None
    table: dict[tuple[Any, int, Any], str] = {
        (None, 0, None): "PolicyModel",
        ("tools", 2, None): "ToolSpec",
        ("rules", 2, None): "RuleSpec",
        ("budgets", 2, None): "BudgetSpec",
        ("rules", 3, "match"): "MatchSpec",
        ("budgets", 3, "match"): "MatchSpec",
        ("budgets", 3, "limit"): "LimitSpec",
        ("approval", 1, None): "ApprovalSpec",
    }
    model = table.get((head, n, loc[2] if n == 3 else None))
    if model is None and n >= 2 and loc[n - 1] == "approvers" and head in ("rules", "approval"):
        model = "ApproversSpec"
    elif model is None and head == "approval" and n == 3 and loc[1] == "os_users":
        model = "OsUserSpec"
    # Fields named after a Python keyword (`not`, `as`) carry a trailing underscore the file does not.
    return tuple(name.rstrip("_") for name in FIELDS[model]) if model else None


def _entity(loc: Loc, data: Mapping[str, Any]) -> tuple[str, Loc]:
    """Name what an error concerns (rule 'x', budget 'y', tool 'z') and the path inside it."""
    head = loc[0] if loc else None
    if head in ("rules", "budgets") and len(loc) >= 2 and isinstance(loc[1], int):
        noun = "rule" if head == "rules" else "budget"
        items = data.get(head)
        item = items[loc[1]] if isinstance(items, list) and loc[1] < len(items) else None
        name = item.get("name") if isinstance(item, Mapping) else None
        return (f"{noun} '{name}'" if isinstance(name, str) else f"{noun} #{loc[1] + 1}"), loc[2:]
    if head == "tools" and len(loc) >= 2:
        return f"tool '{loc[1]}'", loc[2:]
    if head == "approval":
        return "approval", loc[1:]
    return "", loc


def _issue(err: ErrorDetails, data: Mapping[str, Any], source: str, marks: Marks | None) -> PolicyIssue:
    loc: Loc = tuple(err["loc"])
    if len(loc) > 5 and loc[0] == "tools" and loc[2:4] == ("sources", "fields") and loc[5] in ("labels", "choices"):
        loc = (*loc[:5], *loc[6:])  # the tag of a path's value (labels, or choices by record) is not in the file
    kind, ctx = err["type"], err.get("ctx") or {}
    entity, inner = _entity(loc, data)
    path = ".".join(str(p) for p in inner)
    if kind == "extra_forbidden":
        keys = _keys_at(loc[:-1])
        options = sorted(keys) if keys else []
        close = difflib.get_close_matches(str(loc[-1]), options, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"expected one of {', '.join(options)}"
        message = f"unknown key '{loc[-1]}' ({hint})"
    elif kind == "missing":
        message = f"missing key '{loc[-1]}'" + (" (write `version: 1`)" if loc == ("version",) else "")
    elif kind in _SELF_DESCRIBING:
        message = err["msg"]
    elif kind == "greater_than_equal":
        message = f"{path} must not be negative, got {err['input']!r}"
    else:
        text = err["msg"] if kind in _CUSTOM else _plain(err)
        message = f"{path}: {text}" if path else text
    if "subloc" in ctx:
        loc = (*loc, ctx["subloc"])
    if marks is None:
        where = (0, 0)
        if kind in _SELF_DESCRIBING - {"cel", "version"} and path:
            message = f"{path}{'[' + str(ctx['subloc']) + ']' if 'subloc' in ctx else ''}: {message}"
    elif kind == "extra_forbidden":
        where = marks.keys.get(loc, marks.value_at(loc))
    elif kind == "cel" and loc in marks.nodes:
        where = _cel_position(marks, loc, int(ctx["cel_line"]), int(ctx["cel_col"]))
    else:
        where = marks.value_at(loc)
    return PolicyIssue(source, where[0], where[1], f"{entity}: {message}" if entity else message)


def _plain(err: ErrorDetails) -> str:
    kind, msg = err["type"], err["msg"]
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        msg = "should be a mapping (key: value)"
    elif kind in ("tuple_type", "list_type"):
        msg = "should be a list"
    else:
        msg = msg[:1].lower() + msg[1:]
        msg = msg.replace("input should be", "should be")
    value = err.get("input")
    if isinstance(value, (str, int, float, bool)) or value is None:
        msg += f", got {value!r}"
    return msg


def _cel_position(marks: Marks, loc: Loc, cel_line: int, cel_col: int) -> tuple[int, int]:
    """Map a 1-based position inside a `when` string to the file, following the scalar's style."""
    node = marks.nodes[loc]
    lines = marks.text.splitlines()
    start = node.start_mark
    style = getattr(node, "style", None)
    if cel_line == 0:  # the condition as a whole (e.g. empty): point at the value
        return _pos(start)
    if style == "|":
        # Columns inside the expression count from the block's content indentation.
        content = [ln for ln in lines[start.line + 1 : node.end_mark.line + 1] if ln.strip()]
        indent = len(content[0]) - len(content[0].lstrip()) if content else 0
        line_index = start.line + cel_line
        return (line_index + 1, indent + cel_col) if line_index < len(lines) else _pos(start)
    value: str = node.value
    offset = sum(len(part) + 1 for part in value.split("\n")[: cel_line - 1]) + cel_col - 1
    # Plain, quoted and folded scalars join their source lines with one space each.
    first_col = start.column + (1 if style in ("'", '"') else 0)
    line_index = start.line + (1 if style == ">" else 0)
    consumed = 0
    while line_index < len(lines):
        raw = lines[line_index]
        col0 = first_col if line_index == start.line else len(raw) - len(raw.lstrip())
        piece = raw[col0:].rstrip()
        if offset <= consumed + len(piece):
            return line_index + 1, col0 + (offset - consumed) + 1
        consumed += len(piece) + 1
        line_index += 1
    return _pos(start)
