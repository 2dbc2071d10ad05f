"""The policy file's field checks, free of pydantic: what `proctor.policy.schema`'s models run.

The models in `proctor.policy.schema` (pydantic) are the one definition of a policy file;
every check they make that is not a plain type (a choice, a duration, a CEL string, the
`let:` names…) is a function of this module, raising `PydanticCustomError` with the message
an ops engineer should read. Keeping them here, apart from the models, lets
`proctor.policy.fastcheck` run the very same checks through the models' compiled core
schema (`proctor.policy._core_schema`, generated from the models) without importing pydantic,
so `proctor policy check` starts fast.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from pydantic_core import PydanticCustomError

from proctor import durations
from proctor.calls import SIDE_EFFECTS
from proctor.durations import DURATION_PATTERN

__all__ = [
    "BUDGET_SCOPES",
    "BYTE_SIZE_PATTERN",
    "COST_VARIABLES",
    "DURATION_PATTERN",
    "LABEL_PATTERN",
    "LABEL_SCOPE",
    "LIMIT_FIELDS",
    "MODEL_LIMITS",
    "SIDE_EFFECT_VARIABLES",
    "BudgetScope",
    "Choice",
    "ChoicesList",
    "FIELD_PATH_PATTERN",
    "FIELD_WHEN_VARIABLES",
    "LABEL_WHEN_VARIABLES",
    "check_cost",
    "check_field_path",
    "check_field_when",
    "field_labels_kind",
    "check_labels_when",
    "label_lists",
    "sources_into_labels",
    "check_let_section",
    "check_names",
    "check_scope",
    "check_side_effect",
    "check_version",
    "check_when",
    "check_window",
    "compile_with_lets",
    "flush_only_when_harmless",
    "limit_not_empty",
    "match_not_empty",
    "model_limits_unscoped",
    "parse_byte_size",
    "parse_duration",
    "side_effect_is_expression",
    "tuple_from_list",
    "window_fits_scope",
    "with_lets",
]

#: Limits that concern the model, not tool calls: they apply to the whole run.
MODEL_LIMITS = ("model_tokens", "model_cost_usd")
#: Every limit a budget may set (`limit:`).
LIMIT_FIELDS = ("calls", "cost", "wall_time", "model_tokens", "model_cost_usd")
BYTE_SIZE_PATTERN = r"^[0-9]+ ?(B|KB|MB|GB|KiB|MiB|GiB)?$"
_BYTE_UNITS = {"": 1, "B": 1, "KB": 1000, "MB": 1000**2, "GB": 1000**3, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}
LABEL_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.:-]*$"
#: Variables a cost expression may read (it is evaluated before the call, for its budgets).
COST_VARIABLES = ("tool", "args", "run")
#: Variables a side-effect expression may read (`tools: X: {side_effect: "…"}`), and the names (`let:`) it may use.
SIDE_EFFECT_VARIABLES = ("tool", "args", "run")
#: What a budget's `per:` may say: these, or ``label:KEY`` (one pool per value of the run's label KEY).
BUDGET_SCOPES = ("run", "step", "principal", "global")
LABEL_SCOPE = re.compile(r"^label:([A-Za-z0-9_.\-/]+)$")


def _duration_error(value: object) -> PydanticCustomError:
    return PydanticCustomError(
        "duration",
        "bad duration {value} (write a number and a unit: 250ms, 120s, 5m, 1h30m)",
        {"value": repr(value)},
    )


def parse_duration(value: object) -> float:
    """`proctor.durations.parse_duration` for the policy's schema: the same message, as a pydantic error."""
    try:
        return durations.parse_duration(value)
    except ValueError:
        raise _duration_error(value) from None


def parse_byte_size(value: object) -> int:
    """``1048576``, ``"512KiB"``, ``"1 MiB"``, ``"4MB"`` -> bytes (a positive integer)."""
    if type(value) is int and value > 0:
        return value
    m = re.fullmatch(r"([0-9]+) ?(B|KB|MB|GB|KiB|MiB|GiB)?", value.strip()) if isinstance(value, str) else None
    if m is None or int(m.group(1)) <= 0:
        raise PydanticCustomError(
            "byte_size", "bad size {value} (write a positive number of bytes, or with a unit: 512KiB, 1MiB, 4MB)",
            {"value": repr(value)})
    return int(m.group(1)) * _BYTE_UNITS[m.group(2) or ""]


class Choice:
    """A before-validator accepting one of `choices`, with a message that lists them.

    A class (not a closure) so the generated core schema can name it: its repr builds it again.
    """

    __slots__ = ("choices", "label")

    def __init__(self, label: str, choices: tuple[str, ...]) -> None:
        self.label, self.choices = label, choices

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.label!r}, {self.choices!r})"

    def __call__(self, value: object) -> object:
        if isinstance(value, str) and value in self.choices:
            return value
        raise PydanticCustomError(
            "choice",
            "unknown {label} {value} (expected one of {choices})",
            {"label": self.label, "value": repr(value), "choices": ", ".join(self.choices)},
        )


class ChoicesList(Choice):
    """A before-validator for "one choice or a non-empty list of them" -> tuple."""

    __slots__ = ()

    def __call__(self, value: object) -> tuple[str, ...]:
        items: list[Any] = list(value) if isinstance(value, (list, tuple)) else [value]
        if not items:
            raise PydanticCustomError("empty", "empty list for {label}", {"label": self.label})
        for i, item in enumerate(items):
            try:
                super().__call__(item)
            except PydanticCustomError as exc:
                if isinstance(value, (list, tuple)):
                    raise PydanticCustomError(
                        exc.type, exc.message_template, {**(exc.context or {}), "subloc": i}
                    ) from None
                raise
        return tuple(items)


def check_names(value: object) -> tuple[str, ...]:
    """`match.tool`: one tool name or glob, or a non-empty list of them -> tuple."""
    items: list[Any] = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise PydanticCustomError("empty", "empty list for tool", {})
    for i, item in enumerate(items):
        if not isinstance(item, str) or not item.strip():
            ctx: dict[str, Any] = {"value": repr(item)}
            if isinstance(value, (list, tuple)):
                ctx["subloc"] = i
            raise PydanticCustomError("tool_name", "tool must be a name or glob, got {value}", ctx)
    return tuple(items)


def tuple_from_list(value: object) -> object:
    """Strict mode wants a tuple; YAML gives lists."""
    return tuple(value) if isinstance(value, list) else value


def names_or_one(value: object) -> object:
    """`not: principal` or `not: [principal, alice]`: one name or a list of them."""
    if isinstance(value, str):
        return (value,)
    return tuple(value) if isinstance(value, list) else value


#: The policy's `let:` names while it is validated (None: no policy around, e.g. a RuleSpec on its own):
#: name -> expanded expression, or None for each name when `let:` itself is invalid (reported there).
_LETS: ContextVar[dict[str, str | None] | None] = ContextVar("proctor_policy_lets", default=None)


@contextmanager
def _lets_in_scope(raw: object) -> Iterator[None]:
    from proctor.policy.conditions import ConditionError
    from proctor.policy.lets import check_lets

    lets: dict[str, str | None] | None = None
    if isinstance(raw, dict) and raw:
        try:
            lets = dict(check_lets(raw))
        except (ConditionError, TypeError):
            lets = {str(k): None for k in raw}
    token = _LETS.set(lets)
    try:
        yield
    finally:
        _LETS.reset(token)


def with_lets(data: Any, handler: Callable[[Any], Any]) -> Any:
    """The whole policy's wrap-validator: rules and tools are checked knowing the `let:` names."""
    with _lets_in_scope(data.get("let") if isinstance(data, dict) else None):
        return handler(data)


def _cel_error(exc: Any) -> PydanticCustomError:
    return PydanticCustomError("cel", "{message}", {"message": exc.message, "cel_line": exc.line,
                                                    "cel_col": exc.column})


def compile_with_lets(source: str, variables: tuple[str, ...], what: str) -> str:
    """Check `source` against `variables` and the policy's `let:` names (located errors), return it expanded.

    Raises `PydanticCustomError` ("cel") for an unknown name or a syntax error; when `let:` itself is
    invalid, only the source's own syntax is checked (the let error is reported once, there).
    """
    from proctor.policy.conditions import ConditionError, compile_expression
    from proctor.policy.lets import check_source, expand

    lets = _LETS.get() or {}
    try:
        if not lets:
            compile_expression(source, variables, what=what)
            return source
        check_source(source, variables, lets, what)  # names with parameters are called with their arguments
        if any(v is None for v in lets.values()):
            return source
        expanded = expand(source, {k: v for k, v in lets.items() if v is not None})
        compile_expression(expanded, variables, what=what)  # as it runs: every function's arity, names replaced
        return expanded
    except ConditionError as exc:
        raise _cel_error(exc) from None


def side_effect_is_expression(value: str) -> bool:
    """A tool's `side_effect` is a CEL expression unless it is one plain word (a class, or a typo of one)."""
    return not re.fullmatch(r"\s*[A-Za-z_]+\s*", value)


# A string literal the expression can give as its value: the whole expression, or a branch of `?:`.
_RESULT_LITERAL = re.compile(r"""(?:^|[?:])\s*(['"])([^'"\\]*)\1\s*(?=$|[:)])""")


def _check_result_literals(source: str) -> None:
    """A literal the expression would give that is no class (``'externa'``) is a load error, not a run-time deny."""
    from proctor.policy.conditions import ConditionError

    for m in _RESULT_LITERAL.finditer(source):
        if m.group(2) not in SIDE_EFFECTS:
            at = m.start(1)
            line = source.count("\n", 0, at) + 1
            col = at - (source.rfind("\n", 0, at) + 1) + 1
            raise _cel_error(ConditionError(f"side_effect: '{m.group(2)}' is not a side-effect class (expected one "
                                            f"of {', '.join(SIDE_EFFECTS)})", line, col))


def check_side_effect(value: object) -> str:
    """A tool's `side_effect`: a class, or a CEL expression over tool, args and run giving one."""
    if isinstance(value, str) and value in SIDE_EFFECTS:
        return value
    if isinstance(value, str) and value.strip() and side_effect_is_expression(value):
        compile_with_lets(value, SIDE_EFFECT_VARIABLES, "side_effect")
        _check_result_literals(value)
        return value
    raise PydanticCustomError(
        "choice",
        "unknown side_effect {value} (expected one of {choices})",
        {"value": repr(value), "choices": ", ".join(SIDE_EFFECTS)},
    )


def check_cost(value: object) -> int | str:
    """A tool's `cost`: a whole number ≥ 0, or a CEL expression over tool, args and run."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise PydanticCustomError("cost", "cost must not be negative, got {value}", {"value": value})
        return value
    if isinstance(value, str):
        from proctor.policy.conditions import ConditionError, compile_expression

        try:
            compile_expression(value, COST_VARIABLES, what="cost")
        except ConditionError as exc:
            raise PydanticCustomError(
                "cel", "{message}", {"message": exc.message, "cel_line": exc.line, "cel_col": exc.column}
            ) from None
        return value
    raise PydanticCustomError(
        "cost",
        "cost must be a whole number ≥ 0 or a CEL expression in quotes (\"args.amount\"), got {value}",
        {"value": repr(value)},
    )


def flush_only_when_harmless(value: str, info: Any) -> str:
    """`durability: flush` skips the fsync of the audit intent: only for tools declared none or read
    here (losing that record on a power cut must not hide an action with effects)."""
    declared = info.data.get("side_effect")
    if value == "flush" and declared not in ("none", "read"):
        raise PydanticCustomError(
            "durability",
            "durability 'flush' needs side_effect none or read declared here ({side_effect})",
            {"side_effect": f"side_effect is {declared!r}" if declared else "no side_effect declared"},
        )
    return value


def match_not_empty(spec: Any) -> Any:
    """A `match:` gives tool and/or side_effect."""
    if spec.tool is None and spec.side_effect is None:
        raise PydanticCustomError(
            "empty_match", "empty match: give tool and/or side_effect, or leave out match to match every call"
        )
    return spec


def limit_not_empty(spec: Any) -> Any:
    """A budget's `limit:` sets at least one limit."""
    if all(getattr(spec, k) is None for k in LIMIT_FIELDS):
        raise PydanticCustomError(
            "empty_limit", "empty limit: set calls, cost, wall_time, model_tokens or model_cost_usd"
        )
    return spec


def check_scope(value: object) -> str:
    """A budget's `per:`."""
    if isinstance(value, str) and (value in BUDGET_SCOPES or LABEL_SCOPE.match(value)):
        return value
    raise PydanticCustomError(
        "choice",
        "unknown per {value} (expected run, step, principal, global or label:KEY)",
        {"value": repr(value)},
    )


def check_window(value: object) -> float:
    """A budget's `window:`: a duration of at least 1s."""
    seconds = parse_duration(value)
    if seconds < 1:
        raise PydanticCustomError("duration", "{value} is shorter than 1s", {"value": repr(value)})
    return seconds


def window_fits_scope(spec: Any) -> Any:
    """A per-step budget has no window (it starts afresh every step)."""
    if spec.window is not None and spec.per == "step":
        raise PydanticCustomError("per_window", "a per: step budget starts afresh every step: remove window")
    return spec


def model_limits_unscoped(spec: Any) -> Any:
    """model_tokens and model_cost_usd count the whole run: no `match:` beside them."""
    if spec.match is not None and any(getattr(spec.limit, k) is not None for k in MODEL_LIMITS):
        raise PydanticCustomError(
            "scoped_model_limit", "model_tokens and model_cost_usd count the whole run: remove match"
        )
    return spec


def check_when(value: str | None) -> str | None:
    """A rule's `when`: a CEL condition over the variables and the policy's `let:` names."""
    if value is None:
        return None
    from proctor.policy.conditions import VARIABLES, ConditionError, compile_condition

    if _LETS.get():
        compile_with_lets(value, VARIABLES, "when")
        return value
    try:
        compile_condition(value)
    except ConditionError as exc:
        raise _cel_error(exc) from None
    return value


def check_let_section(value: object) -> object:
    """`let:`: a mapping of names to CEL expressions (proctor.policy.lets)."""
    from proctor.policy.conditions import ConditionError
    from proctor.policy.lets import check_lets

    if not isinstance(value, dict):
        raise PydanticCustomError("let", "let: should be a mapping of names to CEL expressions", {})
    try:
        check_lets(value)
    except ConditionError as exc:
        name = getattr(exc, "let_name", None)
        raise PydanticCustomError("cel", "{message}", {"message": exc.message, "cel_line": exc.line,
                                                       "cel_col": exc.column, "subloc": name}) from None
    return value


def check_version(value: object) -> object:
    """`version: 1`, the only one this proctor reads."""
    if value != 1 or type(value) is not int:
        raise PydanticCustomError(
            "version", "unsupported version {value} (this proctor reads version 1)", {"value": repr(value)}
        )
    return value


# -- tools' sources (`tools: X: {sources: …}`, proctor.policy.dataflow) ------------------------------------------

#: A path into a tool's result: keys joined by ``.``, ``[]`` after a key (or alone first) for each item of a list,
#: ``*`` for any key (`check_field_path` says what is wrong with one that does not match).
FIELD_PATH_PATTERN = r"^(\*|[^.\[\]\s*]+)?(\[\])*(\.(\*|[^.\[\]\s*]+)(\[\])*)*$"
_FIELD_PATH = re.compile(FIELD_PATH_PATTERN)
#: Variables a `sources.calls[].when` condition may read: the call's arguments (decided before its result is
#: indexed, by what the run saw until then).
LABEL_WHEN_VARIABLES = ("tool", "args")
#: Variables a `sources.fields` choice's `when` may read: the record holding the value (the map: a file, a message)
#: and the call's arguments.
FIELD_WHEN_VARIABLES = ("record", "tool", "args")


def check_field_path(value: object) -> str:
    """A field path of `sources.fields`: ``files[].id``, ``[].sender``, ``meta.*.email``."""
    if not isinstance(value, str) or not value.strip():
        raise PydanticCustomError("field_path", "a field path is a non-empty string such as 'files[].id'", {})
    if value != value.strip() or not _FIELD_PATH.match(value) or value.startswith("."):
        raise PydanticCustomError(
            "field_path", "'{path}' is not a field path: keys joined by '.', '[]' for each item of a list "
                          "('files[].id', '[].sender'), '*' for any key", {"path": value})
    return value


def label_lists(value: object) -> object:
    """`sources.fields`: each path's labels (or choices of them), a list in YAML -> a tuple (strict mode)."""
    if isinstance(value, dict):
        return {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()}
    return value


def field_labels_kind(value: object) -> str:
    """Which a `sources.fields` path's value is: ``choices`` (a list holding a map: ``[{when: …, labels: […]}]``) or
    ``labels`` (anything else, checked as a list of labels). (Also asked when a validated policy is dumped: its
    choices are records then, not maps.)"""
    if isinstance(value, (list, tuple)) and any(v is not None and not isinstance(v, (str, int, float)) for v in value):
        return "choices"
    return "labels"


def check_field_when(value: object) -> str:
    """`sources.fields` choice's `when`: a CEL condition over the record holding the value, the call's tool and
    arguments (and the `let:` names)."""
    if not isinstance(value, str):
        raise PydanticCustomError("cel", "{message}", {"message": "when: write a CEL condition in quotes",
                                                       "cel_line": 0, "cel_col": 0})
    compile_with_lets(value, FIELD_WHEN_VARIABLES, "when")
    return value


def check_labels_when(value: object) -> str:
    """`sources.calls[].when`: a CEL condition over the call's tool and arguments (and the `let:` names)."""
    if not isinstance(value, str):
        raise PydanticCustomError("cel", "{message}", {"message": "when: write a CEL condition in quotes",
                                                       "cel_line": 0, "cel_col": 0})
    compile_with_lets(value, LABEL_WHEN_VARIABLES, "when")
    return value


def _labels_in(value: object) -> list[str]:
    """The valid labels of a list, or of a list of field choices' `labels` (an invalid one is reported where it is
    written)."""
    if not isinstance(value, (list, tuple)):
        return []
    found: list[str] = []
    for v in value:
        if isinstance(v, dict):
            found.extend(_labels_in(v.get("labels")))
        elif isinstance(v, str) and re.match(LABEL_PATTERN, v):
            found.append(v)
    return found


def sources_into_labels(data: Any) -> Any:
    """A tool with `sources`: its `labels` become every label its results may carry (those of the fields and
    calls added), and `sources.result` the labels written under `labels` (the rest of the result).

    So whatever reads a tool's `labels` alone (the run's `seen`, a gate indexing the whole result under them, a
    resumed run marking them unseen) errs towards every label the result may carry, never fewer.
    """
    if not isinstance(data, dict) or not isinstance(data.get("sources"), dict):
        return data
    sources = dict(data["sources"])
    if "result" in sources:
        raise PydanticCustomError("sources", "sources: write the labels of the rest of the result under the "
                                             "tool's labels:, not sources.result", {"subloc": "sources"})
    written = _labels_in(data.get("labels", []))
    every = list(data.get("labels", [])) if isinstance(data.get("labels", []), (list, tuple)) else written
    fields = sources.get("fields")
    more = [label for labels in (fields.values() if isinstance(fields, dict) else ()) for label in _labels_in(labels)]
    calls = sources.get("calls")
    for entry in calls if isinstance(calls, (list, tuple)) else ():
        if isinstance(entry, dict):
            more.extend(_labels_in(entry.get("labels")))
    every.extend(label for label in dict.fromkeys(more) if label not in every)
    return {**data, "labels": every, "sources": {**sources, "result": written}}


class BudgetScope:
    """What a budget's `per:` means (shared by `schema.BudgetSpec` and the fast check's records)."""

    if TYPE_CHECKING:
        per: str

    @property
    def shared(self) -> bool:
        """True when the budget counts calls of more than one run (principal, label, global)."""
        return self.per not in ("run", "step")

    @property
    def label_key(self) -> str | None:
        """KEY of ``per: label:KEY``, else None."""
        return self.per[6:] if self.per.startswith("label:") else None
