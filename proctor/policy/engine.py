"""`Policy`: load a policy once, then decide calls fast and the same way every time.

Combining is order-independent: among the rules that match a call, `deny` beats
`require_approval` beats `allow`; no match gives the policy's `default`. A `when`
that cannot be evaluated counts as a matching `deny` naming the rule and the error.

Rules are indexed by exact tool name, by glob and by side-effect class; the list of
candidate rules for each (tool, class) is computed once and cached (bounded), so a
decision only evaluates rules that can match. Deny rules are evaluated first: once a
deny holds nothing else can change the outcome, so the others are not evaluated.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast

from proctor.calls import SIDE_EFFECTS, Call, Decision, Outcome, RunInfo, SideEffect
from proctor.canonical import canonical_sha256
from proctor.errors import ToolDenied
from proctor.policy.activation import Activation
from proctor.policy.aggregates import is_hidden, pipeline_named
from proctor.policy.approvers import ApproverRule, OsUser, required
from proctor.policy.conditions import Condition, EvaluationError, compile_condition, compile_expression
from proctor.policy.functions import PROVENANCE_FUNCTIONS, RECORD_FUNCTIONS
from proctor.policy.lets import check_lets, expand
from proctor.policy.loader import load_policy_text, validate_policy_data
from proctor.policy.matching import Matcher
from proctor.policy.projection import Needs, merge_needs
from proctor.policy.validators import COST_VARIABLES, SIDE_EFFECT_VARIABLES, side_effect_is_expression
from proctor.policy.yamlsafe import read_yaml_file

if TYPE_CHECKING:
    from proctor.ledger.base import SharedLedger
    from proctor.policy.budgets import Ledger
    from proctor.policy.explain import Explanation
    from proctor.policy.schema import ApproversSpec, BudgetSpec, PolicyModel, RuleSpec
    from proctor.provenance import ResultLabeller

__all__ = ["ApprovalSettings", "CompiledRule", "Policy", "ToolFacts"]

_CANDIDATE_CACHE = 4096


@dataclass(frozen=True, slots=True)
class ToolFacts:
    """What the gate needs to know about a tool, after the policy's `tools:` overrides."""

    side_effect: SideEffect
    cost: int
    timeout_s: float | None
    redact: tuple[str, ...]
    durability: Literal["fsync", "flush"]
    #: Data-flow labels: a call that ran adds them to the run's `seen`.
    labels: tuple[str, ...] = ()
    #: `cost` as a CEL expression over the call (`tools: X: {cost: "args.amount"}`); then `cost` is 0.
    cost_expression: Condition | None = None
    #: Fields approvers see redacted too (they see the rest of the arguments in clear).
    hide_from_approvers: tuple[str, ...] = ()
    max_arg_bytes: int | None = None  # None: the interpreter's own limit
    #: `side_effect` as a CEL expression over the call (`tools: X: {side_effect: "…"}`); then
    #: `side_effect` is destructive until the gate evaluates it with the call's arguments.
    side_effect_expression: Condition | None = None


@dataclass(frozen=True, slots=True)
class ApprovalSettings:
    """How long a human has to answer, and what happens when nobody does."""

    timeout_s: float = 300.0
    on_timeout: Literal["deny"] = "deny"
    #: Who may answer (`approval.approvers`) when the rules that asked name nobody.
    default_approvers: ApproverRule | None = None
    #: Each `require_approval` rule's own `approvers:` (None: it names nobody).
    by_rule: Mapping[str, ApproverRule | None] = field(default_factory=dict)
    #: OS users answering through the store: whom each may act as, and its groups.
    os_users: Mapping[str, OsUser] = field(default_factory=dict)
    #: The inbox's token file, where the gate reads the groups of an approver who answered by token.
    tokens: str | None = None

    def approvers_for(self, rules: Sequence[str]) -> tuple[ApproverRule, ...]:
        """The `approvers:` specs an answer to a call decided by `rules` must meet (all of them)."""
        return required(rules, self.by_rule, self.by_rule, self.default_approvers)

    @classmethod
    def from_model(cls, model: PolicyModel) -> ApprovalSettings:
        def spec(source: str, given: ApproversSpec | None) -> ApproverRule | None:
            return None if given is None else ApproverRule(source, given.groups, given.users, given.not_)

        return cls(model.approval.timeout, model.approval.on_timeout,
                   spec("approval.approvers", model.approval.approvers),
                   {r.name: spec(f"rule {r.name!r}", r.approvers) for r in model.rules
                    if r.decision == "require_approval"},
                   {name: OsUser(u.as_, u.groups) for name, u in model.approval.os_users.items()},
                   model.approval.tokens)


@dataclass(frozen=True, slots=True)
class CompiledRule:
    """A rule ready to evaluate: its matcher and compiled condition."""

    index: int
    spec: RuleSpec
    matcher: Matcher
    condition: Condition | None
    #: Why the rule decides as it does: its `reason`, else the rule named (`_reason`); set at construction.
    reason: str = ""

    def __post_init__(self) -> None:
        if not self.reason:
            object.__setattr__(self, "reason", _reason(self))

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def decision(self) -> Outcome:
        return self.spec.decision


@dataclass(frozen=True, slots=True)
class Candidates:
    """The rules that can match one (tool, class), split by decision, in file order."""

    deny: tuple[CompiledRule, ...]
    others: tuple[CompiledRule, ...]  # require_approval and allow rules
    needs: Needs  # what the conditions of these rules read of each variable
    functions: tuple[str, ...] = ()  # the registered CEL functions their conditions call
    #: `needs` without history folds: for a short plain history, which CEL reads whole (see Activation).
    plain_needs: Needs | None = None
    #: The decision for every call, when none of these rules has a condition (most reads).
    fixed: Decision | None = None

    @property
    def all(self) -> tuple[CompiledRule, ...]:
        return tuple(sorted((*self.deny, *self.others), key=lambda r: r.index))


def _normalized(model: PolicyModel) -> dict[str, Any]:
    """The policy's meaning as plain data: defaults filled in, order-free lists sorted."""
    data = model.model_dump(mode="python")
    for section in ("rules", "budgets"):
        for item in data[section]:
            match = item.get("match")
            if match:
                item["match"] = {k: sorted(set(v)) if v is not None else None for k, v in match.items()}
        data[section] = sorted(data[section], key=lambda item: item["name"])
    if not data["let"]:  # added later: absent when unused, so older policies keep their fingerprint
        del data["let"]
    if data.get("reload") == "each_call":  # added later: absent when unused, so older policies keep theirs
        del data["reload"]
    for later, default in (("sandbox", "auto"), ("ledger", "shared")):  # added later, as `let`
        if data[later] == default:
            del data[later]
    for spec in data["tools"].values():
        if spec.get("sources") is None:  # added later: absent when unused, so older policies keep their fingerprint
            spec.pop("sources", None)
        spec["redact"] = sorted(set(spec["redact"]))
        for later in ("labels", "hide_from_approvers"):
            if spec[later]:
                spec[later] = sorted(set(spec[later]))
            else:  # a field added later: absent when unused, so older policies keep their fingerprint
                del spec[later]
    return data


class Policy:
    """A loaded, validated policy. Immutable and safe to share between threads."""

    def __init__(self, model: PolicyModel, source: str = "<policy>") -> None:
        self.model = model
        self.source = source
        self.sha256 = canonical_sha256(_normalized(model))
        self.approval = ApprovalSettings.from_model(model)
        #: The `let:` names, each expanded to a CEL expression without names (proctor.policy.lets).
        self.lets = check_lets(model.let) if model.let else {}
        self.compiled = tuple(
            CompiledRule(i, r, Matcher.from_spec(r.match),
                         compile_condition(expand(r.when, self.lets)) if r.when is not None else None)
            for i, r in enumerate(model.rules)
        )
        #: Tools whose side-effect class is a CEL expression over the call, compiled.
        self._side_effect_expressions = {
            name: compile_expression(expand(spec.side_effect, self.lets), SIDE_EFFECT_VARIABLES, "side_effect")
            for name, spec in model.tools.items()
            if spec.side_effect is not None and side_effect_is_expression(spec.side_effect)
        }
        #: Every label the policy gives tools (their results are indexed under them).
        self.result_labels = tuple(sorted({label for spec in model.tools.values() for label in spec.labels}))
        #: Whether a condition reads where values came from: then each run keeps a provenance index.
        self.uses_provenance = any(
            PROVENANCE_FUNCTIONS.intersection(c.functions)
            for c in (*(r.condition for r in self.compiled), *self._side_effect_expressions.values())
            if c is not None
        )
        #: Whether a rule or side-effect expression reads records (`same_record`, `same_call`): the index then keeps
        #: the records of results of tools with sources (`proctor.policy.dataflow.result_sources`).
        self.uses_records = any(
            RECORD_FUNCTIONS.intersection(c.functions)
            for c in (*(r.condition for r in self.compiled), *self._side_effect_expressions.values())
            if c is not None
        )
        by_tool: dict[str, list[int]] = {}
        self._globbed: list[int] = []
        self._any_tool: list[int] = []
        for rule in self.compiled:
            if rule.matcher.names is None:
                self._any_tool.append(rule.index)
                continue
            for name in rule.matcher.names:
                by_tool.setdefault(name, []).append(rule.index)
            if rule.matcher.globs:
                self._globbed.append(rule.index)
        self._by_tool = {k: tuple(v) for k, v in by_tool.items()}
        #: The history pipelines the conditions read, folded per run as calls happen (RunContext.track).
        self.pipelines = tuple(dict.fromkeys(
            pipeline_named(name) for rule in self.compiled if rule.condition is not None
            for name in rule.condition.fast_variables if is_hidden(name)
        ))
        any_class = frozenset(r.index for r in self.compiled if r.matcher.side_effects is None)
        self._by_class: dict[str, frozenset[int]] = {
            se: any_class | {r.index for r in self.compiled if se in (r.matcher.side_effects or ())}
            for se in SIDE_EFFECTS
        }
        self._any_class = any_class
        self.candidates = functools.lru_cache(maxsize=_CANDIDATE_CACHE)(self._compute_candidates)
        #: The decisions that depend on nothing of the call (a Decision is immutable: one serves every call):
        #: no rule matched, and each rule's when it alone decided, for its own reason.
        self._no_match_decision: Decision | None = None
        self._single: dict[int, Decision] = {}
        # The gate asks for a tool's facts on every call; they never change for a loaded policy.
        self.facts = functools.lru_cache(maxsize=_CANDIDATE_CACHE)(self._facts)  # type: ignore[method-assign]

    # -- construction -------------------------------------------------------------
    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str], *, regular_only: bool = False) -> Policy:
        """Load a policy file; raises PolicyError listing every problem with its line and column (`regular_only`:
        anything but a regular file is such an error, refused without blocking on it)."""
        source = str(path)
        return cls(load_policy_text(read_yaml_file(path, "policy", regular_only=regular_only), source), source)

    @classmethod
    def from_string(cls, text: str, source: str = "<string>") -> Policy:
        """Load a policy from YAML text."""
        return cls(load_policy_text(text, source), source)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<dict>") -> Policy:
        """Load a policy from plain data; issues have no line (0:0) and name the path instead."""
        return cls(validate_policy_data(data, source), source)

    # -- read access ----------------------------------------------------------------
    @property
    def default(self) -> Outcome:
        return self.model.default

    @property
    def rules(self) -> tuple[RuleSpec, ...]:
        return self.model.rules

    @property
    def budgets(self) -> tuple[BudgetSpec, ...]:
        return self.model.budgets

    def __repr__(self) -> str:
        return f"Policy({self.source!r}, rules={len(self.compiled)}, sha256={self.sha256[:12]}…)"

    # -- facts and ledgers ------------------------------------------------------------
    def facts(self, tool: str, declared_side_effect: SideEffect | None = None, declared_cost: int = 0) -> ToolFacts:
        """The facts of `tool`: the policy's `tools:` entry overrides the declaration; undeclared is destructive."""
        return self._facts(tool, declared_side_effect, declared_cost)  # replaced by a cached `_facts` per instance

    def _facts(self, tool: str, declared_side_effect: SideEffect | None = None, declared_cost: int = 0) -> ToolFacts:
        spec = self.model.tools.get(tool)
        declared_cost = declared_cost or 0  # a tool may declare None
        if spec is None:
            fixed: SideEffect = declared_side_effect or "destructive"
            return ToolFacts(fixed, declared_cost, None, (), self._durability(fixed, None))
        expression = None
        cost = spec.cost if spec.cost is not None else declared_cost
        if isinstance(cost, str):
            expression, cost = compile_expression(cost, COST_VARIABLES, "cost"), 0
        dynamic = self._side_effect_expressions.get(tool)
        side_effect: SideEffect = "destructive" if dynamic is not None else (
            cast(SideEffect, spec.side_effect) or declared_side_effect or "destructive")
        return ToolFacts(
            side_effect=side_effect,
            cost=cost,
            timeout_s=spec.timeout,
            redact=spec.redact,
            durability=self._durability(side_effect, spec.durability),
            labels=spec.labels,
            cost_expression=expression,
            hide_from_approvers=spec.hide_from_approvers,
            max_arg_bytes=spec.max_arg_bytes,
            side_effect_expression=dynamic,
        )

    def side_effect_of(self, tool: str, args: Mapping[str, Any], declared: SideEffect | None = None,
                       run: RunInfo | None = None) -> SideEffect:
        """The class of this call of `tool`: its `side_effect` expression evaluated over the arguments,
        else the policy's or the declared class (undeclared: destructive).

        An expression that fails, or gives anything but a class, raises `ToolDenied` naming the
        tool (the call is denied: fail closed).
        """
        expression = self._side_effect_expressions.get(tool)
        if expression is None:
            return self.facts(tool, declared).side_effect
        variables = {"tool": tool, "args": dict(args), "run": (run or RunInfo()).as_dict()}
        try:
            value = expression.compute(variables)
        except EvaluationError as exc:
            raise ToolDenied(f"{tool}: denied: its side_effect `{expression.source}` could not be computed: {exc}",
                             tool=tool) from None
        if not isinstance(value, str) or value not in SIDE_EFFECTS:
            raise ToolDenied(f"{tool}: denied: its side_effect `{expression.source}` gave {value!r}, not one of "
                             f"{', '.join(SIDE_EFFECTS)}", tool=tool)
        return value  # one of SIDE_EFFECTS, checked above

    @property
    def dynamic_side_effects(self) -> frozenset[str]:
        """The tools whose side-effect class depends on the call (a CEL expression)."""
        return frozenset(self._side_effect_expressions)

    def _durability(self, side_effect: SideEffect, declared: Literal["fsync", "flush"] | None) -> Literal[
            "fsync", "flush"]:
        """A call's intent is fsynced unless its tool only reads: then the policy's `read_durability` (flush)."""
        if declared is not None:
            return declared
        return self.model.read_durability if side_effect in ("none", "read") else "fsync"

    def cost_of(
        self, tool: str, args: Mapping[str, Any], declared_cost: int = 0, run: RunInfo | None = None
    ) -> float:
        """The call's cost for every cost budget: the policy's fixed cost or CEL expression, else the declared one.

        An expression must give an int or a double ≥ 0; an error or a negative value raises
        `ToolDenied` naming the tool (the call is denied, fail closed).
        """
        facts = self.facts(tool, None, declared_cost)
        expression = facts.cost_expression
        if expression is None:
            return facts.cost
        variables = {"tool": tool, "args": dict(args), "run": (run or RunInfo()).as_dict()}
        try:
            value = expression.compute(variables)
        except EvaluationError as exc:
            raise ToolDenied(f"{tool}: denied: its cost `{expression.source}` could not be computed: {exc}",
                             tool=tool) from None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise ToolDenied(f"{tool}: denied: its cost `{expression.source}` gave {value!r}, not a number",
                             tool=tool)
        if value == float("inf"):  # a double that overflowed: no ledger can count it (Redis refuses infinities)
            raise ToolDenied(f"{tool}: denied: its cost `{expression.source}` gave {value!r}, not a finite number",
                             tool=tool)
        if value < 0:
            raise ToolDenied(f"{tool}: denied: its cost `{expression.source}` gave {value!r}, a negative cost",
                             tool=tool)
        return value

    def result_sources(self, tool: str) -> ResultLabeller | None:
        """How `tool`'s results are labelled by field path and by call (`sources:`), or None: its `labels`."""
        from proctor.policy.dataflow import result_sources

        return result_sources(self, tool)

    def new_ledger(self, run: RunInfo | None = None, shared: SharedLedger | None = None) -> Ledger:
        """A fresh budget ledger for one run; its shared budgets (principal, label, global) draw on `shared`."""
        from proctor.policy.budgets import Ledger  # here: loading a policy (`policy check`) needs no ledger

        return Ledger(self.model.budgets, run=run, shared=shared)

    # -- deciding -----------------------------------------------------------------
    def _compute_candidates(self, tool: str, side_effect: str) -> Candidates:
        indexes = set(self._by_tool.get(tool, ()))
        indexes.update(i for i in self._globbed if self.compiled[i].matcher.tool_matches(tool))
        indexes.update(self._any_tool)
        indexes &= self._by_class.get(side_effect, self._any_class)
        rules = [self.compiled[i] for i in sorted(indexes)]
        fixed = None
        if all(r.condition is None for r in rules):  # every candidate holds for every call: decide now
            for outcome in ("deny", "require_approval", "allow"):
                held = [(r, r.reason) for r in rules if r.decision == outcome]
                if held:
                    fixed = self._decision(outcome, held)
                    break
            else:
                fixed = self._no_match()
        return Candidates(
            deny=tuple(r for r in rules if r.decision == "deny"),
            others=tuple(r for r in rules if r.decision != "deny"),
            # (a condition decided in Python from probes needs no variable converted; if it falls back to
            # CEL, its variables are converted then)
            needs=merge_needs([r.condition.needs for r in rules
                               if r.condition is not None]),
            plain_needs=merge_needs([r.condition.plain_needs or r.condition.needs
                                     for r in rules if r.condition is not None]),
            # (a condition whose provenance calls are probes calls fewer functions; its fallback adds them)
            functions=tuple(sorted({f for r in rules if r.condition is not None
                                    for f in (r.condition.functions if r.condition.probed is None
                                              else r.condition.probed_functions)})),
            fixed=fixed,
        )

    def fixed_decision(self, tool: str, side_effect: SideEffect) -> Decision | None:
        """The decision of every call of `tool` whose class is `side_effect` (after the policy's
        `tools:` overrides), when it depends on nothing else: no rule that can match has a
        condition. None when `decide` must see the call. Lets the gate skip building a `Call`.
        """
        return self.candidates(tool, side_effect).fixed

    def decide(self, call: Call) -> Decision:
        """Decide one call: deny > require_approval > allow among matching rules; else the default."""
        if self._side_effect_expressions and call.tool in self._side_effect_expressions:
            try:
                side_effect: str = self.side_effect_of(call.tool, call.args, call.side_effect, call.run)
            except ToolDenied as exc:
                return Decision("deny", (), str(exc).removeprefix(f"{call.tool}: denied: "), self.sha256)
        else:
            spec = self.model.tools.get(call.tool)  # facts().side_effect, without building ToolFacts
            side_effect = (spec.side_effect if spec is not None else None) or call.side_effect or "destructive"
        candidates: Candidates = self.candidates(call.tool, side_effect)
        if candidates.fixed is not None:
            return candidates.fixed
        activation = Activation(call, side_effect, candidates.needs, candidates.functions, candidates.plain_needs)
        activation.prepare()
        denied: list[tuple[CompiledRule, str]] = []
        for rule in candidates.deny:
            verdict = _evaluate(rule, activation)
            if verdict is not False:
                denied.append((rule, verdict if isinstance(verdict, str) else rule.reason))
        if not denied:
            held: dict[str, list[CompiledRule]] = {"require_approval": [], "allow": []}
            for rule in candidates.others:
                verdict = _evaluate(rule, activation)
                if isinstance(verdict, str):
                    denied.append((rule, verdict))
                elif verdict:
                    held[rule.decision].append(rule)
            if not denied:
                for outcome in ("require_approval", "allow"):
                    if held[outcome]:
                        return self._decision(outcome, [(r, r.reason) for r in held[outcome]])
                return self._no_match()
        return self._decision("deny", denied)

    def _no_match(self) -> Decision:
        # (a Decision is immutable: the same one serves every call no rule matched)
        found = self._no_match_decision
        if found is None:
            found = self._no_match_decision = Decision(
                self.default, (), f"no rule matched; the policy default is {self.default}", self.sha256)
        return found

    def explain(self, call: Call) -> Explanation:
        """Decide `call` and trace every rule against it (for people; slower than `decide`)."""
        from proctor.policy.explain import explain

        return explain(self, call)

    def _decision(self, outcome: Outcome, held: list[tuple[CompiledRule, str]]) -> Decision:
        if len(held) == 1:
            rule, reason = held[0]
            if reason is rule.reason and rule.decision == outcome:  # the rule's own: one Decision for every call
                found = self._single.get(rule.index)
                if found is None:
                    found = self._single[rule.index] = Decision(outcome, (rule.name,), reason, self.sha256)
                return found
            return Decision(outcome, (rule.name,), reason, self.sha256)
        held.sort(key=lambda pair: pair[0].index)
        reasons = list(dict.fromkeys(reason for _, reason in held))
        return Decision(outcome, tuple(r.name for r, _ in held), "; ".join(reasons), self.sha256)

    def describe_tool(self, tool: str, side_effect: SideEffect | None = None) -> str:
        """One line for a model's system prompt saying what the policy does with `tool`."""
        facts = self.facts(tool, side_effect)
        rules = self.candidates(tool, facts.side_effect).all
        phrase = {"deny": "denied", "require_approval": "needs human approval", "allow": "allowed"}
        parts: list[str] = []
        unconditional = None
        for outcome in ("deny", "require_approval", "allow"):
            for rule in (r for r in rules if r.decision == outcome):
                why = f" ({rule.spec.reason})" if rule.spec.reason and outcome != "allow" else ""
                if rule.condition is None:
                    unconditional = unconditional or outcome
                    parts.append(f"{phrase[outcome]}{why}")
                else:
                    parts.append(f"{phrase[outcome]} when {rule.condition.source.strip()}{why}")
            if unconditional:
                break
        if not unconditional:
            parts.append(f"{'otherwise ' if parts else ''}{phrase[self.default]} (policy default)")
        return "; ".join(parts)


def _reason(rule: CompiledRule) -> str:
    if rule.spec.reason:
        return rule.spec.reason
    verb = {"deny": "denied by", "require_approval": "approval required by", "allow": "allowed by"}[rule.decision]
    return f"{verb} rule '{rule.name}'"


def _evaluate(rule: CompiledRule, activation: Activation) -> bool | str:
    """True/False when the rule holds or not; a string (the deny reason) when its condition failed."""
    if rule.condition is None:
        return True
    try:
        return rule.condition.evaluate(activation)
    except EvaluationError as exc:
        return f"rule '{rule.name}': condition failed: {exc}"
