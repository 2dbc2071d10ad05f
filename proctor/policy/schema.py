"""The version-1 policy file as pydantic models (DESIGN §5).

Every model forbids unknown keys (a typo must never be silently ignored) and is
strict (``cost: "5"`` is an error, not 5). Fields that take a choice, a duration, or
"a name or a list" use small validators that raise `PydanticCustomError` with the
message an ops engineer should read; the loader adds the file, line, column and the
rule/budget/tool the error concerns. Validators that can point *inside* a value (an
item of a list, a position inside a CEL string) say so through the error's context
(``subloc``, ``cel_line``/``cel_col``) and the loader narrows the location.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from proctor.calls import OUTCOMES, SIDE_EFFECTS, Outcome, SideEffect

__all__ = [
    "BUDGET_SCOPES",
    "COST_VARIABLES",
    "SIDE_EFFECT_VARIABLES",
    "DURATION_PATTERN",
    "LABEL_PATTERN",
    "MODEL_LIMITS",
    "ApprovalSpec",
    "BudgetSpec",
    "LimitSpec",
    "MatchSpec",
    "PolicyModel",
    "RuleSpec",
    "ToolSpec",
    "parse_duration",
    "policy_json_schema",
    "side_effect_is_expression",
]

DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
#: Limits that concern the model, not tool calls: they apply to the whole run.
MODEL_LIMITS = ("model_tokens", "model_cost_usd")


def _duration_error(value: object) -> PydanticCustomError:
    return PydanticCustomError(
        "duration",
        "bad duration {value} (write a number and a unit: 250ms, 120s, 5m, 1h30m)",
        {"value": repr(value)},
    )


def parse_duration(value: object) -> float:
    """Parse ``250ms``, ``120s``, ``5m`` or ``1h30m`` into seconds; a bare number is refused (unit unclear)."""
    if not isinstance(value, str) or not re.fullmatch(DURATION_PATTERN, value.strip()):
        raise _duration_error(value)
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(value.strip()))


def _choice(label: str, choices: tuple[str, ...]) -> Any:
    """A before-validator accepting one of `choices`, with a message that lists them."""

    def check(value: object) -> object:
        if isinstance(value, str) and value in choices:
            return value
        raise PydanticCustomError(
            "choice",
            "unknown {label} {value} (expected one of {choices})",
            {"label": label, "value": repr(value), "choices": ", ".join(choices)},
        )

    return check


def _choices_list(label: str, choices: tuple[str, ...]) -> Any:
    """A before-validator for "one choice or a non-empty list of them" -> tuple."""
    one = _choice(label, choices)

    def check(value: object) -> tuple[str, ...]:
        items: list[Any] = list(value) if isinstance(value, (list, tuple)) else [value]
        if not items:
            raise PydanticCustomError("empty", "empty list for {label}", {"label": label})
        for i, item in enumerate(items):
            try:
                one(item)
            except PydanticCustomError as exc:
                if isinstance(value, (list, tuple)):
                    raise PydanticCustomError(
                        exc.type, exc.message_template, {**(exc.context or {}), "subloc": i}
                    ) from None
                raise
        return tuple(items)

    return check


def _names(value: object) -> tuple[str, ...]:
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


def _enum_schema(choices: tuple[str, ...]) -> dict[str, Any]:
    return {"type": "string", "enum": list(choices)}


def _one_or_list(item: dict[str, Any]) -> dict[str, Any]:
    # if/then/else, not anyOf: a validator then reports the item that is wrong
    # (`side_effect[0]: 'reed' is not one of [...]`), not "not valid under any of the given schemas".
    return {"if": {"type": "array"}, "then": {"type": "array", "items": item, "minItems": 1}, "else": item}


Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    WithJsonSchema({"type": "string", "pattern": DURATION_PATTERN, "examples": ["250ms", "120s", "5m", "1h30m"]}),
]
SideEffectField = Annotated[
    SideEffect, BeforeValidator(_choice("side_effect", SIDE_EFFECTS)), WithJsonSchema(_enum_schema(SIDE_EFFECTS))
]
OutcomeField = Annotated[
    Outcome, BeforeValidator(_choice("decision", OUTCOMES)), WithJsonSchema(_enum_schema(OUTCOMES))
]
DefaultField = Annotated[Outcome, BeforeValidator(_choice("default", OUTCOMES)), WithJsonSchema(_enum_schema(OUTCOMES))]
Name = Annotated[str, Field(min_length=1, pattern=r"\S")]
BYTE_SIZE_PATTERN = r"^[0-9]+ ?(B|KB|MB|GB|KiB|MiB|GiB)?$"
_BYTE_UNITS = {"": 1, "B": 1, "KB": 1000, "MB": 1000**2, "GB": 1000**3, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


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


ByteSize = Annotated[
    int,
    BeforeValidator(parse_byte_size),
    WithJsonSchema({"anyOf": [{"type": "integer", "minimum": 1},
                              {"type": "string", "pattern": BYTE_SIZE_PATTERN, "examples": ["512KiB", "1MiB"]}]}),
]
Count = Annotated[int, Field(ge=0)]
Amount = Annotated[float, Field(ge=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


LABEL_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.:-]*$"
Label = Annotated[str, Field(pattern=LABEL_PATTERN)]
#: Variables a cost expression may read (it is evaluated before the call, for its budgets).
COST_VARIABLES = ("tool", "args", "run")
#: Variables a side-effect expression may read (`tools: X: {side_effect: "…"}`), and the names (`let:`) it may use.
SIDE_EFFECT_VARIABLES = ("tool", "args", "run")

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


def _cel_error(exc: Any) -> PydanticCustomError:
    return PydanticCustomError("cel", "{message}", {"message": exc.message, "cel_line": exc.line,
                                                    "cel_col": exc.column})


def compile_with_lets(source: str, variables: tuple[str, ...], what: str) -> str:
    """Check `source` against `variables` and the policy's `let:` names (located errors), return it expanded.

    Raises `PydanticCustomError` ("cel") for an unknown name or a syntax error; when `let:` itself is
    invalid, only the source's own syntax is checked (the let error is reported once, there).
    """
    from proctor.policy.conditions import ConditionError, compile_expression
    from proctor.policy.lets import expand

    lets = _LETS.get() or {}
    try:
        compile_expression(source, tuple(dict.fromkeys((*variables, *lets))), what=what)
        if any(v is None for v in lets.values()):
            return source
        used = {k: v for k, v in lets.items() if v is not None}
        for bound in re.finditer(r"\.\s*(?:all|exists|exists_one|map|filter)\s*\(\s*([A-Za-z_]\w*)\s*,", source):
            if bound.group(1) in used:
                line = source.count("\n", 0, bound.start(1)) + 1
                col = bound.start(1) - (source.rfind("\n", 0, bound.start(1)) + 1) + 1
                raise ConditionError(f"{what}: '{bound.group(1)}' is a let name; use another name for the macro's "
                                     "variable", line, col)
        expanded = expand(source, used)
        if expanded != source:
            compile_expression(expanded, variables, what=what)
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


def _side_effect_or_expression(value: object) -> str:
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


ToolSideEffectField = Annotated[
    str,
    BeforeValidator(_side_effect_or_expression),
    # One plain word must be a class (so `reed` reads "'reed' is not one of …"); anything else is CEL.
    WithJsonSchema({"type": "string", "minLength": 1,
                    "if": {"pattern": r"^\s*[A-Za-z_]+\s*$"}, "then": _enum_schema(SIDE_EFFECTS),
                    "description": "a side-effect class, or a CEL expression over tool, args and run giving one, "
                                   "e.g. \"size(args.participants.filter(p, !p.endsWith('@corp.example'))) > 0 ? "
                                   "'external' : 'write'\""}),
]


def _cost(value: object) -> int | str:
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


CostField = Annotated[
    int | str,
    BeforeValidator(_cost),
    # One schema with two types (not anyOf): each keyword applies to its own type, so -1 reads
    # "less than the minimum of 0", not "not valid under any of the given schemas".
    WithJsonSchema({"type": ["integer", "string"], "minimum": 0, "minLength": 1,
                    "description": "budget units per call: a whole number, or a CEL expression such as "
                                   "\"args.amount\" (int or double ≥ 0)"}),
]


DurabilityField = Annotated[
    Literal["fsync", "flush"],
    BeforeValidator(_choice("durability", ("fsync", "flush"))),
    WithJsonSchema(_enum_schema(("fsync", "flush"))),
]


class ToolSpec(_Strict):
    """Facts ops declare about one tool; each set field overrides the tool's own declaration."""

    #: A class, or a CEL expression over tool, args and run giving one (checked when the call is made:
    #: an error or an unknown class denies the call).
    side_effect: ToolSideEffectField | None = None
    #: Budget units per call: a whole number, or a CEL expression over the arguments (``"args.amount"``).
    cost: CostField | None = None
    #: Data-flow labels: a call that ran adds them to the run's `seen`.
    labels: tuple[Label, ...] = ()
    timeout: Duration | None = None
    redact: tuple[Annotated[str, Field(pattern=r"^[^.\s]+(\.[^.\s]+)*$")], ...] = ()
    #: Fields approvers do not see in clear either (by default a human sees what is being approved).
    hide_from_approvers: tuple[Annotated[str, Field(pattern=r"^[^.\s]+(\.[^.\s]+)*$")], ...] = ()
    #: How the call's audit intent is written: fsync (on disk before the tool runs) or flush (handed to the
    #: OS; lost only on a power cut). Unset: the policy's `read_durability` for none/read tools, else fsync.
    durability: DurabilityField | None = None
    #: Safe to run again when a crash lost its outcome (a durable run resumes it instead of failing it).
    idempotent: bool = False
    #: Largest arguments one call may send, in bytes of JSON (the Interpreter checks it before decoding).
    max_arg_bytes: ByteSize | None = None

    @field_validator("redact", "labels", "hide_from_approvers", mode="before")
    @classmethod
    def _redact_list(cls, value: object) -> object:
        # Strict mode wants a tuple; YAML gives lists.
        return tuple(value) if isinstance(value, list) else value

    @field_validator("durability")
    @classmethod
    def _flush_only_when_harmless(cls, value: str, info: ValidationInfo) -> str:
        # `flush` skips the fsync of the audit intent; only acceptable when losing that
        # record on a power cut cannot hide an action with effects.
        declared = info.data.get("side_effect")
        if value == "flush" and declared not in ("none", "read"):
            raise PydanticCustomError(
                "durability",
                "durability 'flush' needs side_effect none or read declared here ({side_effect})",
                {"side_effect": f"side_effect is {declared!r}" if declared else "no side_effect declared"},
            )
        return value


class MatchSpec(_Strict):
    """Which calls a rule or budget concerns: all given fields must match."""

    tool: (
        Annotated[
            tuple[str, ...], BeforeValidator(_names), WithJsonSchema(_one_or_list({"type": "string", "minLength": 1}))
        ]
        | None
    ) = None
    side_effect: (
        Annotated[
            tuple[SideEffect, ...],
            BeforeValidator(_choices_list("side_effect", SIDE_EFFECTS)),
            WithJsonSchema(_one_or_list(_enum_schema(SIDE_EFFECTS))),
        ]
        | None
    ) = None

    @model_validator(mode="after")
    def _not_empty(self) -> MatchSpec:
        if self.tool is None and self.side_effect is None:
            raise PydanticCustomError(
                "empty_match", "empty match: give tool and/or side_effect, or leave out match to match every call"
            )
        return self


class LimitSpec(_Strict):
    """The limits of one budget; at least one must be set."""

    calls: Count | None = None
    cost: Amount | None = None
    wall_time: Duration | None = None
    model_tokens: Count | None = None
    model_cost_usd: Amount | None = None

    @model_validator(mode="after")
    def _something(self) -> LimitSpec:
        if all(getattr(self, k) is None for k in type(self).model_fields):
            raise PydanticCustomError(
                "empty_limit", "empty limit: set calls, cost, wall_time, model_tokens or model_cost_usd"
            )
        return self


#: What a budget's `per:` may say: these, or ``label:KEY`` (one pool per value of the run's label KEY).
BUDGET_SCOPES = ("run", "step", "principal", "global")
_LABEL_SCOPE = re.compile(r"^label:([A-Za-z0-9_.\-/]+)$")


def _scope(value: object) -> str:
    if isinstance(value, str) and (value in BUDGET_SCOPES or _LABEL_SCOPE.match(value)):
        return value
    raise PydanticCustomError(
        "choice",
        "unknown per {value} (expected run, step, principal, global or label:KEY)",
        {"value": repr(value)},
    )


def _window(value: object) -> float:
    seconds = parse_duration(value)
    if seconds < 1:
        raise PydanticCustomError("duration", "{value} is shorter than 1s", {"value": repr(value)})
    return seconds


class BudgetSpec(_Strict):
    """An allowance over the calls its match selects, per run (default), step, principal, label or globally.

    `window`, when set, makes the budget start afresh at every fixed window (aligned on the
    Unix epoch: a `24h` window resets at 00:00 UTC). Budgets shared between runs (principal,
    label, global) live in the gate's ledger (`Gate(ledger=...)`), which may be shared by many
    processes through Redis.
    """

    name: Name
    match: MatchSpec | None = None
    limit: LimitSpec
    per: Annotated[
        str,
        BeforeValidator(_scope),
        WithJsonSchema({"anyOf": [_enum_schema(BUDGET_SCOPES), {"type": "string", "pattern": _LABEL_SCOPE.pattern}]}),
    ] = "run"
    window: (
        Annotated[
            float,
            BeforeValidator(_window),
            WithJsonSchema({"type": "string", "pattern": DURATION_PATTERN, "examples": ["1h", "24h"]}),
        ]
        | None
    ) = None

    @property
    def shared(self) -> bool:
        """True when the budget counts calls of more than one run (principal, label, global)."""
        return self.per not in ("run", "step")

    @property
    def label_key(self) -> str | None:
        """KEY of ``per: label:KEY``, else None."""
        return self.per[6:] if self.per.startswith("label:") else None

    @model_validator(mode="after")
    def _window_fits_scope(self) -> BudgetSpec:
        if self.window is not None and self.per == "step":
            raise PydanticCustomError("per_window", "a per: step budget starts afresh every step: remove window")
        return self

    @model_validator(mode="after")
    def _model_limits_unscoped(self) -> BudgetSpec:
        if self.match is not None and any(getattr(self.limit, k) is not None for k in MODEL_LIMITS):
            raise PydanticCustomError(
                "scoped_model_limit", "model_tokens and model_cost_usd count the whole run: remove match"
            )
        return self


class RuleSpec(_Strict):
    """One rule: calls its match selects, for which `when` holds, get `decision`."""

    name: Name
    match: MatchSpec | None = None
    when: str | None = None
    decision: OutcomeField
    reason: str | None = None

    @field_validator("when")
    @classmethod
    def _compile(cls, value: str | None) -> str | None:
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


def _let_section(value: object) -> object:
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


LetField = Annotated[
    dict[str, str],
    BeforeValidator(_let_section),
    WithJsonSchema({"type": "object", "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                    "additionalProperties": {"type": "string", "minLength": 1},
                    "description": "named CEL expressions, usable by name in every when (and side_effect "
                                   "expressions)"}),
]


class ApprovalSpec(_Strict):
    """How long a human has to answer, and what happens when nobody does."""

    timeout: Duration = 300.0
    on_timeout: Annotated[
        Literal["deny"], BeforeValidator(_choice("on_timeout", ("deny",))), WithJsonSchema(_enum_schema(("deny",)))
    ] = "deny"


class PolicyModel(_Strict):
    """A whole version-1 policy file."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, title="proctor policy (version 1)")

    version: Annotated[int, WithJsonSchema({"const": 1})]
    #: Named CEL expressions defined once, usable by name in every `when` (see proctor.policy.lets).
    let: LetField = Field(default_factory=dict)
    default: DefaultField = "deny"
    tools: dict[str, ToolSpec] = Field(default_factory=dict)
    budgets: tuple[BudgetSpec, ...] = ()
    rules: tuple[RuleSpec, ...] = ()
    approval: ApprovalSpec = Field(default_factory=ApprovalSpec)
    #: Audit durability of calls to `none`/`read` tools without their own `durability`: flush (the
    #: default: a read's intent is written and flushed, not fsynced) or fsync (every intent on disk).
    read_durability: DurabilityField = "flush"

    @model_validator(mode="wrap")
    @classmethod
    def _with_lets(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # Rules and tools are checked knowing the `let:` names (a `when` may use them).
        with _lets_in_scope(data.get("let") if isinstance(data, dict) else None):
            return handler(data)

    @field_validator("budgets", "rules", mode="before")
    @classmethod
    def _lists(cls, value: object) -> object:
        return tuple(value) if isinstance(value, list) else value

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, value: object) -> object:
        if value != 1 or type(value) is not int:
            raise PydanticCustomError(
                "version", "unsupported version {value} (this proctor reads version 1)", {"value": repr(value)}
            )
        return value


def _without_null(node: Any) -> Any:
    """Drop the ``null`` branch pydantic gives optional fields: YAML users leave a key out, never write
    ``null``, and a validator's "best match" would otherwise be ``'reed' is not of type 'null'``."""
    if isinstance(node, list):
        return [_without_null(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _without_null(value) for key, value in node.items()}
    branches = out.get("anyOf")
    if isinstance(branches, list) and {"type": "null"} in branches:
        kept = [b for b in branches if b != {"type": "null"}]
        del out["anyOf"]
        if out.get("default", 0) is None:
            del out["default"]
        if len(kept) == 1 and not set(kept[0]) & set(out):
            out.update(kept[0])
        else:
            out["anyOf"] = kept
    return out


def policy_json_schema() -> dict[str, Any]:
    """The JSON Schema of policy files (`proctor policy schema`), shaped for editors and check-jsonschema."""
    schema: dict[str, Any] = _without_null(PolicyModel.model_json_schema())
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    # Durations are written as strings in YAML; show the default the way a user writes it.
    schema["$defs"]["ApprovalSpec"]["properties"]["timeout"]["default"] = "5m"
    return schema
