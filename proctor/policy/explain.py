"""Why a policy decided what it did: every rule, whether it was considered and how it fared.

`explain` is for people (the `policy explain` command, debugging a policy); the gate
uses `Policy.decide`, which evaluates only the rules that can matter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from proctor.calls import Call, Decision
from proctor.policy.activation import Activation
from proctor.policy.admission import decide_call
from proctor.policy.aggregates import window_notes
from proctor.policy.conditions import ConditionError, EvaluationError, compile_expression
from proctor.policy.lets import uses
from proctor.policy.simulate import decide_like_gate
from proctor.provenance import ProvenanceIndex

if TYPE_CHECKING:  # `Policy.explain` calls this module: the policy is read here, never built
    from proctor.policy.engine import Policy
    from proctor.tools import Tool

__all__ = ["Explanation", "RuleTrace", "argument_sources", "explain", "history_notes"]


@dataclass(frozen=True, slots=True)
class RuleTrace:
    """One rule's part in a decision: did it match the call, and why (not)."""

    name: str
    decision: str
    matched: bool
    note: str


@dataclass(frozen=True, slots=True)
class Explanation:
    """The decision, the side-effect class it was made for, and the trace of every rule.

    When a budget refused the call, `decision` names no rule (the budget decided: `budget`) and
    `rules_decision` is what the rules alone decided.
    """

    decision: Decision
    side_effect: str
    rules: tuple[RuleTrace, ...]
    #: The budget that refused the call, when one did (the gate refuses it before any human is asked).
    budget: str | None = None
    #: The arguments after validation with the tool's schema (defaults filled in); None without tools.
    args: Mapping[str, Any] | None = None
    #: The rules' own decision, when a budget overruled it (else None).
    rules_decision: Decision | None = None
    #: One line per rule that reads history through a window it writes (``history.last(N)``).
    windows: tuple[str, ...] = ()
    #: Where each argument came from, one line each, when the call has a provenance index (`argument_sources`).
    sources: tuple[str, ...] = ()


def argument_sources(call: Call) -> tuple[str, ...]:
    """For each argument of `call` that is a string or a number: whether the user wrote it, its provenance, where
    it appeared as a whole field (``TOOL:PATH``) under which labels, and which other arguments one record (and
    one call's result) held with it — what `from_user`, `provenance`, `field_paths`, `field_provenance`,
    `same_record` and `same_call` answer. Empty without a provenance index."""
    index = call.provenance
    if not isinstance(index, ProvenanceIndex):
        return ()
    plain = {k: v for k, v in call.args.items()
             if isinstance(v, (str, int, float)) and not isinstance(v, bool)}
    lines = []
    for name, value in plain.items():
        parts = [f"from_user {'yes' if index.from_user(value) else 'no'}",
                 f"provenance [{', '.join(index.labels_of(value))}]"]
        paths = index.field_paths(value)
        if paths:
            parts.append(f"a whole field at {', '.join(paths)} [{', '.join(index.field_labels(value))}]")
        records = [other for other in plain if other != name and index.same_record(value, plain[other])]
        if records:
            parts.append(f"one record with {', '.join('args.' + r for r in records)}")
        calls = [other for other in plain if other != name and other not in records
                 and index.same_call(value, plain[other])]
        if calls:
            parts.append(f"one call's result with {', '.join('args.' + c for c in calls)}")
        lines.append(f"args.{name}: {'; '.join(parts)}")
    return tuple(lines)


def _listing(values: object) -> str:
    return ", ".join(sorted(str(v) for v in values)) if isinstance(values, (set, frozenset, tuple)) else str(values)


def _let_values(policy: Policy, written: str, activation: Activation) -> str:
    """`` (where vouched(args.to) = true, outbound = false)``: the value of each `let:` name the condition uses,
    for this call (a name that fails says so)."""
    if not policy.lets:
        return ""
    parts = []
    for use in uses(written, policy.lets):
        try:
            value = compile_expression(use.expanded).compute(activation)
            shown = "true" if value is True else "false" if value is False else repr(value)
        except (ConditionError, EvaluationError) as exc:
            shown = f"error ({exc})"
        parts.append(f"{use.written} = {shown}")
    return f" (where {', '.join(parts)})" if parts else ""


def explain(
    policy: Policy,
    call: Call,
    tools: Mapping[str, Tool] | None = None,
    usage: Mapping[str, Mapping[str, float]] | None = None,
) -> Explanation:
    """Decide `call` as the gate would (`decide_like_gate`) and trace every rule of `policy`, in file order."""
    simulation = decide_like_gate(policy, call, tools, usage)
    decision, side_effect, call = simulation.decision, simulation.side_effect, simulation.call
    activation = Activation(call, side_effect)
    traces = []
    for rule in policy.compiled:
        matcher = rule.matcher
        matched = False
        if not matcher.tool_matches(call.tool):
            names = sorted([*(matcher.names or ()), *matcher.globs])
            note = f"tool '{call.tool}' is not {_listing(tuple(names))}"
        elif not matcher.side_effect_matches(side_effect):
            note = f"side_effect {side_effect} is not {_listing(matcher.side_effects)}"
        elif rule.condition is None:
            matched, note = True, "matches (no condition)"
        else:
            written = (rule.spec.when or rule.condition.source).strip()
            values = _let_values(policy, written, activation)
            try:
                matched = rule.condition.evaluate(activation)
                note = f"when {'holds' if matched else 'does not hold'}: {written}{values}"
            except EvaluationError as exc:
                matched, note = True, f"condition failed (counts as deny): {exc}{values}"
        traces.append(RuleTrace(rule.name, rule.decision, matched, note))
    rules_decision = None
    if simulation.budget is not None:  # the budget decided, not the rule that allowed the call
        rules_decision = decide_call(policy, call)
        decision = replace(decision, rules=())
    return Explanation(decision, side_effect, tuple(traces), simulation.budget,
                       dict(call.args) if simulation.defaults_applied else None, rules_decision,
                       history_notes(policy), argument_sources(call))



def history_notes(policy: Policy) -> tuple[str, ...]:
    """For each rule whose condition reads history through a window it writes, the line that says so."""
    return window_notes((rule.name, rule.condition.source if rule.condition is not None else None)
                        for rule in policy.compiled)
