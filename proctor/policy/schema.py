"""The version-1 policy file as pydantic models (DESIGN §5).

Every model forbids unknown keys (a typo must never be silently ignored) and is
strict (``cost: "5"`` is an error, not 5). Fields that take a choice, a duration, or
"a name or a list" use small validators that raise `PydanticCustomError` with the
message an ops engineer should read; the loader adds the file, line, column and the
rule/budget/tool the error concerns. Validators that can point *inside* a value (an
item of a list, a position inside a CEL string) say so through the error's context
(``subloc``, ``cel_line``/``cel_col``) and the loader narrows the location.

Those validators are functions of `proctor.policy.validators` (no pydantic there), and the models'
compiled core schema is generated into `proctor.policy._core_schema` for `proctor policy check`
(`proctor.policy.fastcheck`): after changing a model, run ``python -m proctor.policy.fastcheck --write``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from proctor.calls import OUTCOMES, SIDE_EFFECTS, Outcome, SideEffect
from proctor.policy import validators as _v
from proctor.policy.validators import (
    BUDGET_SCOPES,
    BYTE_SIZE_PATTERN,
    COST_VARIABLES,
    DURATION_PATTERN,
    LABEL_PATTERN,
    LABEL_SCOPE,
    MODEL_LIMITS,
    SIDE_EFFECT_VARIABLES,
    BudgetScope,
    Choice,
    ChoicesList,
    compile_with_lets,
    parse_byte_size,
    parse_duration,
    side_effect_is_expression,
)

__all__ = [
    "BUDGET_SCOPES",
    "COST_VARIABLES",
    "SIDE_EFFECT_VARIABLES",
    "DURATION_PATTERN",
    "LEDGER_MODES",
    "SANDBOX_MODES",
    "LABEL_PATTERN",
    "MODEL_LIMITS",
    "ApprovalSpec",
    "BudgetSpec",
    "CallLabels",
    "LimitSpec",
    "MatchSpec",
    "PolicyModel",
    "RuleSpec",
    "SourcesSpec",
    "ToolSpec",
    "compile_with_lets",
    "parse_byte_size",
    "parse_duration",
    "policy_json_schema",
    "side_effect_is_expression",
]


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
    SideEffect, BeforeValidator(Choice("side_effect", SIDE_EFFECTS)), WithJsonSchema(_enum_schema(SIDE_EFFECTS))
]
OutcomeField = Annotated[
    Outcome, BeforeValidator(Choice("decision", OUTCOMES)), WithJsonSchema(_enum_schema(OUTCOMES))
]
DefaultField = Annotated[Outcome, BeforeValidator(Choice("default", OUTCOMES)), WithJsonSchema(_enum_schema(OUTCOMES))]
Name = Annotated[str, Field(min_length=1, pattern=r"\S")]


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


Label = Annotated[str, Field(pattern=LABEL_PATTERN)]

ToolSideEffectField = Annotated[
    str,
    BeforeValidator(_v.check_side_effect),
    # One plain word must be a class (so `reed` reads "'reed' is not one of …"); anything else is CEL.
    WithJsonSchema({"type": "string", "minLength": 1,
                    "if": {"pattern": r"^\s*[A-Za-z_]+\s*$"}, "then": _enum_schema(SIDE_EFFECTS),
                    "description": "a side-effect class, or a CEL expression over tool, args and run giving one, "
                                   "e.g. \"size(args.participants.filter(p, !p.endsWith('@corp.example'))) > 0 ? "
                                   "'external' : 'write'\""}),
]

CostField = Annotated[
    int | str,
    BeforeValidator(_v.check_cost),
    # One schema with two types (not anyOf): each keyword applies to its own type, so -1 reads
    # "less than the minimum of 0", not "not valid under any of the given schemas".
    WithJsonSchema({"type": ["integer", "string"], "minimum": 0, "minLength": 1,
                    "description": "budget units per call: a whole number, or a CEL expression such as "
                                   "\"args.amount\" (int or double ≥ 0)"}),
]


#: `sandbox:` -- how model-written programs must be isolated. auto: bubblewrap where it can run, else a
#: plain process (the run summary says which); required: without a usable bubblewrap nothing starts.
SANDBOX_MODES = ("auto", "required")
#: `ledger:` -- where budgets shared between runs (per principal, label, global) must live. shared: a ledger
#: several processes share (Redis); without one the gate refuses to start. local: this process's own
#: ledger is meant (each process then counts on its own), stated in the run summary and the audit log.
LEDGER_MODES = ("shared", "local")

SandboxField = Annotated[
    Literal["auto", "required"],
    BeforeValidator(Choice("sandbox", SANDBOX_MODES)),
    WithJsonSchema(_enum_schema(SANDBOX_MODES)),
]
LedgerField = Annotated[
    Literal["shared", "local"],
    BeforeValidator(Choice("ledger", LEDGER_MODES)),
    WithJsonSchema(_enum_schema(LEDGER_MODES)),
]

DurabilityField = Annotated[
    Literal["fsync", "flush"],
    BeforeValidator(Choice("durability", ("fsync", "flush"))),
    WithJsonSchema(_enum_schema(("fsync", "flush"))),
]


FieldPath = Annotated[
    str,
    BeforeValidator(_v.check_field_path),
    WithJsonSchema({"type": "string", "pattern": _v.FIELD_PATH_PATTERN, "examples": ["files[].id", "[].sender", "id"],
                    "description": "a path into the tool's result: keys joined by '.', '[]' for each item of a "
                                   "list, '*' for any key"}),
]


class CallLabels(_Strict):
    """Labels for the calls whose arguments satisfy `when` (``a page fetched from a URL the user gave``)."""

    #: A CEL condition over `tool` and `args` (the provenance functions read what the run has seen before this
    #: result): the first entry whose condition holds gives the result its labels instead of the tool's `labels`.
    when: Annotated[str, BeforeValidator(_v.check_labels_when)]
    labels: tuple[Label, ...]

    _labels_list = field_validator("labels", mode="before")(_v.tuple_from_list)


class FieldChoice(_Strict):
    """Labels for the values at a field path chosen by the record holding them (``content`` is ``trusted`` when the
    file's ``owner`` is the user): the first choice whose `when` holds, one without `when` always holding."""

    #: A CEL condition over `record` (the map holding the value: the file, the message), `tool` and `args`; the
    #: provenance functions read what the run had seen before this result. None: this choice always holds.
    when: Annotated[str, BeforeValidator(_v.check_field_when)] | None = None
    labels: tuple[Label, ...]

    _labels_list = field_validator("labels", mode="before")(_v.tuple_from_list)


#: A path's labels, or its choices of labels by record (told apart by whether the list holds maps: one error each).
FieldLabelsField = Annotated[
    Annotated[tuple[Label, ...], Tag("labels")] | Annotated[tuple[FieldChoice, ...], Tag("choices")],
    Discriminator(_v.field_labels_kind),
]


class SourcesSpec(_Strict):
    """Where a tool's result came from, finer than one set of labels (docs/policy.md, "Field-level sources")."""

    #: The labels of the result outside `fields` (the tool's own `labels`: filled in by the loader, never written).
    result: tuple[Label, ...] = ()
    #: Labels of the values at these paths of the result, instead of `result`'s (``files[].id: [drive_id]``), or
    #: choices of labels by the record holding them (`FieldChoice`).
    fields: dict[FieldPath, FieldLabelsField] = Field(default_factory=dict)
    #: Labels chosen by the call's arguments, first match wins (else the tool's `labels`).
    calls: tuple[CallLabels, ...] = ()
    #: Also index the result's runs of two to four words, so an argument copying a phrase of it is traced.
    phrases: bool = False

    _lists = field_validator("calls", "result", mode="before")(_v.tuple_from_list)
    _field_lists = field_validator("fields", mode="before")(_v.label_lists)


#: When runs in flight take a reloaded policy (`proctor.policy.reload`): at their next call, or only runs
#: started after the reload (each run keeps the policy it started with).
RELOAD_MODES = ("each_call", "new_runs")
ReloadField = Annotated[
    Literal["each_call", "new_runs"],
    BeforeValidator(Choice("reload", RELOAD_MODES)),
    WithJsonSchema(_enum_schema(RELOAD_MODES)),
]


class ToolSpec(_Strict):
    """Facts ops declare about one tool; each set field overrides the tool's own declaration."""

    #: A class, or a CEL expression over tool, args and run giving one (checked when the call is made:
    #: an error or an unknown class denies the call).
    side_effect: ToolSideEffectField | None = None
    #: Budget units per call: a whole number, or a CEL expression over the arguments (``"args.amount"``).
    cost: CostField | None = None
    #: Data-flow labels: a call that ran adds them to the run's `seen`, and its result is indexed under them for
    #: `provenance()`. With `sources`, every label the tool's results may carry (the loader adds those of
    #: `sources` to the ones written here, which `sources.result` keeps).
    labels: tuple[Label, ...] = ()
    #: Labels per field of the result, per call, and phrases (`SourcesSpec`); None: the result is one source.
    sources: SourcesSpec | None = None
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

    # Validators are functions of proctor.policy.validators (the fast check runs them without pydantic).
    _redact_list = field_validator("redact", "labels", "hide_from_approvers", mode="before")(_v.tuple_from_list)
    _sources_labels = model_validator(mode="before")(_v.sources_into_labels)
    _flush_only_when_harmless = field_validator("durability")(_v.flush_only_when_harmless)


class MatchSpec(_Strict):
    """Which calls a rule or budget concerns: all given fields must match."""

    tool: (
        Annotated[
            tuple[str, ...],
            BeforeValidator(_v.check_names),
            WithJsonSchema(_one_or_list({"type": "string", "minLength": 1})),
        ]
        | None
    ) = None
    side_effect: (
        Annotated[
            tuple[SideEffect, ...],
            BeforeValidator(ChoicesList("side_effect", SIDE_EFFECTS)),
            WithJsonSchema(_one_or_list(_enum_schema(SIDE_EFFECTS))),
        ]
        | None
    ) = None

    _not_empty = model_validator(mode="after")(_v.match_not_empty)


class LimitSpec(_Strict):
    """The limits of one budget; at least one must be set."""

    calls: Count | None = None
    cost: Amount | None = None
    wall_time: Duration | None = None
    model_tokens: Count | None = None
    model_cost_usd: Amount | None = None

    _something = model_validator(mode="after")(_v.limit_not_empty)


class BudgetSpec(_Strict, BudgetScope):
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
        BeforeValidator(_v.check_scope),
        WithJsonSchema({"anyOf": [_enum_schema(BUDGET_SCOPES), {"type": "string", "pattern": LABEL_SCOPE.pattern}]}),
    ] = "run"
    window: (
        Annotated[
            float,
            BeforeValidator(_v.check_window),
            WithJsonSchema({"type": "string", "pattern": DURATION_PATTERN, "examples": ["1h", "24h"]}),
        ]
        | None
    ) = None

    _window_fits_scope = model_validator(mode="after")(_v.window_fits_scope)
    _model_limits_unscoped = model_validator(mode="after")(_v.model_limits_unscoped)


class ApproversSpec(_Strict):
    """Who may answer a call's approval (`approvers:` on a rule, or the default under `approval:`).

    An answerer must be in one of `groups` or be one of `users` (when either is given) and must not be
    anyone `not` names; `principal` there means the run's principal (four eyes)."""

    groups: tuple[Name, ...] = ()
    users: tuple[Name, ...] = ()
    not_: tuple[Name, ...] = Field(default=(), alias="not")

    _names = field_validator("groups", "users", "not_", mode="before")(_v.names_or_one)


class OsUserSpec(_Strict):
    """What an OS user answering through `proctor approvals --store` may act as, and their groups."""

    as_: tuple[Name, ...] = Field(default=(), alias="as")
    groups: tuple[Name, ...] = ()

    _names = field_validator("as_", "groups", mode="before")(_v.names_or_one)


class RuleSpec(_Strict):
    """One rule: calls its match selects, for which `when` holds, get `decision`."""

    name: Name
    match: MatchSpec | None = None
    when: str | None = None
    decision: OutcomeField
    reason: str | None = None
    #: Who may answer when this rule asks for approval (the policy's `approval.approvers` otherwise).
    approvers: ApproversSpec | None = None

    _compile = field_validator("when")(_v.check_when)


LetField = Annotated[
    dict[str, str],
    BeforeValidator(_v.check_let_section),
    WithJsonSchema({"type": "object",
                    "propertyNames": {"pattern": r"^[A-Za-z_][A-Za-z0-9_]*(\s*\(\s*([A-Za-z_][A-Za-z0-9_]*"
                                                 r"(\s*,\s*[A-Za-z_][A-Za-z0-9_]*)*)?\s*\))?$"},
                    "additionalProperties": {"type": "string", "minLength": 1},
                    "description": "named CEL expressions, usable by name in every when (and side_effect "
                                   "expressions); a name with parameters, vouched(v), is used as a call: "
                                   "vouched(args.to)"}),
]


class ApprovalSpec(_Strict):
    """How long a human has to answer, and what happens when nobody does."""

    timeout: Duration = 300.0
    on_timeout: Annotated[
        Literal["deny"], BeforeValidator(Choice("on_timeout", ("deny",))), WithJsonSchema(_enum_schema(("deny",)))
    ] = "deny"
    #: Who may answer, for every approval whose rules do not say (`approvers:` on a rule).
    approvers: ApproversSpec | None = None
    #: OS users answering through the store (`proctor approvals … --store`): who each may act as
    #: (`--as`) and their groups. An OS user listed nowhere answers as themselves, in no group.
    os_users: dict[Name, OsUserSpec] = Field(default_factory=dict)
    #: The inbox's token file (`proctor serve --tokens`), read by the gate to check the groups of an
    #: approver who answered with a token.
    tokens: str | None = None


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
    #: A gate reloading this file (`proctor.policy.reload`): runs in flight switch at their next call
    #: (each_call, the default) or keep the policy they started with (new_runs).
    reload: ReloadField = "each_call"
    #: How programs must be isolated: auto (bubblewrap when usable, else a plain process) or required.
    sandbox: SandboxField = "auto"
    #: Where cross-run budgets live: shared (a fleet's ledger, the default: required when such budgets
    #: exist) or local (this process's own ledger is meant; the run summary and audit log say so).
    ledger: LedgerField = "shared"

    # Rules and tools are checked knowing the `let:` names (a `when` may use them).
    _with_lets = model_validator(mode="wrap")(_v.with_lets)  # type: ignore[arg-type]  # a function, not a classmethod
    _lists = field_validator("budgets", "rules", mode="before")(_v.tuple_from_list)
    _version = field_validator("version", mode="before")(_v.check_version)


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
