"""Admission: the one decision of a tool call, before anything acts on it.

`admit` is what decides a call, for everyone: the gate (each call, and an approver's
edit of one), `policy test` and `policy explain` (`proctor.policy.simulate`), and any
tool that asks what a policy would do with a recorded call. Nothing else calls the
engine's `decide`, `facts`, `side_effect_of`, `cost_of` or `fixed_decision` (a test walks
the package to hold this): what else needs them — a tool's declared facts before any call
(`facts_of`: an unread call refused by size, prompts, lint, budget traces), the class a
recorded call had (`class_over_args`), the rules' own decision `policy explain` shows
beside a budget's refusal (`decide_call`) — asks here too. `admit` is
pure: it reads the run (history, usage, `seen`, provenance) and writes nothing — no
audit record, span, ledger reservation or journal entry. In order:

    tool lookup → facts (narrowed by managed agents' layers) → argument validation
        → the class over the arguments (`side_effect:` expression) → decision
        (the run's policy, then each layer's: strictest wins) → cost (when not denied)

It stops at the first step that refuses the call and says which (`Admission.stage`).
What acts on the admission — budgets, approval, audit, the tool — is the gate's.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from proctor.calls import (
    BudgetFigures,
    Call,
    Decision,
    HistoryEntry,
    JSONValue,
    RunInfo,
    SideEffect,
    side_effect_rank,
)
from proctor.errors import ToolDenied
from proctor.narrowing import narrow_decision, narrow_facts

if TYPE_CHECKING:
    from proctor.policy.engine import ToolFacts
    from proctor.provenance import ProvenanceIndex

__all__ = ["Admission", "AdmissionPolicy", "AdmittedTool", "FactSource", "LayerView", "LazyUsage", "RunView", "Stage",
           "admit", "call_for", "class_over_args", "decide_call", "facts_of", "has_fixed_decision"]

#: Where admission stopped: a refusal's step, or "decided" when the call got a decision and a cost.
Stage = Literal["tool", "args", "class", "policy", "cost", "decided"]


class AdmittedTool(Protocol):
    """What admission needs of a tool: its declared facts and its argument schema."""

    @property
    def name(self) -> str: ...
    @property
    def side_effect(self) -> SideEffect | None: ...
    @property
    def cost(self) -> int: ...
    def validate(self, args: Mapping[str, JSONValue]) -> dict[str, JSONValue]: ...


class FactSource(Protocol):
    """What reading a tool's facts needs of a policy (`facts_of`); every `AdmissionPolicy` is one."""

    def facts(self, tool: str, declared_side_effect: SideEffect | None = None, declared_cost: int = 0) -> ToolFacts: ...


class AdmissionPolicy(FactSource, Protocol):
    """What admission needs of a policy; `proctor.Policy` is one."""

    @property
    def sha256(self) -> str: ...
    def fixed_decision(self, tool: str, side_effect: SideEffect) -> Decision | None: ...
    def decide(self, call: Call) -> Decision: ...
    def side_effect_of(self, tool: str, args: Mapping[str, JSONValue], declared: SideEffect | None = None,
                       run: RunInfo | None = None) -> SideEffect: ...
    def cost_of(self, tool: str, args: Mapping[str, JSONValue], declared_cost: int = 0,
                run: RunInfo | None = None) -> float: ...


class UsageSource(Protocol):
    def usage(self) -> dict[str, BudgetFigures]: ...


class LayerView(Protocol):
    """A managed agent's own policy and the budgets it counts (`proctor.narrowing.Layer`)."""

    @property
    def policy(self) -> AdmissionPolicy: ...
    @property
    def ledger(self) -> UsageSource: ...


class RunView(Protocol):
    """What a decision reads of the run; `proctor.gate.run.RunContext` is one, `policy test` builds its own."""

    @property
    def info(self) -> RunInfo: ...
    @property
    def provenance(self) -> ProvenanceIndex | None: ...
    def history_view(self) -> Sequence[HistoryEntry]: ...
    def seen_labels(self) -> Sequence[str]: ...
    def usage_view(self) -> Mapping[str, BudgetFigures]: ...


class LazyUsage(Mapping[str, Any]):
    """A ledger's usage, read only if a condition looks at `usage` (most never do)."""

    __slots__ = ("_ledger", "_usage")

    def __init__(self, ledger: UsageSource) -> None:
        self._ledger = ledger
        self._usage: dict[str, Any] | None = None

    def _get(self) -> dict[str, Any]:
        if self._usage is None:
            self._usage = self._ledger.usage()
        return self._usage

    def __getitem__(self, key: str) -> Any:
        return self._get()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


@dataclass(frozen=True, slots=True, kw_only=True)
class Admission:
    """How a call was admitted: the facts the gate acts on, and the refusal if one stopped it.

    `decision` is set once the policy decided (stage "policy" with a deny, "cost", "decided");
    `refusal` is the error to raise in the program for every stage but "decided" — for a
    policy deny it is None: the gate words that refusal itself, with the decision's rules.
    """

    stage: Stage
    name: str
    tool: AdmittedTool | None
    facts: ToolFacts | None
    #: Each layer's own facts of the tool (managed agents), in layer order.
    layer_facts: tuple[ToolFacts, ...] = ()
    #: The validated arguments (defaults completed); the raw ones when validation refused them.
    args: Mapping[str, Any]
    side_effect: SideEffect = "destructive"
    decision: Decision | None = None
    #: The run policy's decision, then each layer's (layer None for the run's), when layers voted.
    votes: tuple[tuple[Any, Decision], ...] = ()
    cost: float = 0.0
    refusal: ToolDenied | None = None

    @property
    def validated(self) -> bool:
        """The arguments passed the tool's schema (every stage after "args")."""
        return self.stage not in ("tool", "args")

    @property
    def denied(self) -> bool:
        return self.stage != "decided"


def admit(
    policy: AdmissionPolicy,
    name: str,
    args: Mapping[str, Any] | None,
    *,
    tools: Mapping[str, AdmittedTool] | None,
    run: RunView,
    layers: Sequence[LayerView] = (),
    declared_side_effect: SideEffect | None = None,
    declared_cost: int = 0,
    expected: AdmittedTool | None = None,
) -> Admission:
    """Decide the call of `name` with `args` in `run` (see the module docstring).

    `tools` is the table the call may name (None: no schemas — `policy test` without tools:
    the arguments are taken as written and the class and cost come from `declared_*`).
    `expected`, when the caller holds a tool object, must be the table's (another object of
    the same name is refused as unknown). The policy's own exceptions from `facts` propagate
    (the gate ends such a call as refused by a fault); a policy that raises while deciding
    denies, naming why.
    """
    raw: Mapping[str, Any] = args if args is not None else {}
    tool: AdmittedTool | None = None
    if tools is not None:
        tool = tools.get(name)
        if tool is None or (expected is not None and expected is not tool):
            known = ", ".join(sorted(tools)) or "none"
            return Admission(stage="tool", name=name, tool=None, facts=None, args={},
                             refusal=ToolDenied(f"unknown tool {name!r} (known: {known})", tool=name))
        declared_side_effect, declared_cost = tool.side_effect, tool.cost
    facts = policy.facts(name, declared_side_effect, declared_cost)
    layer_facts: tuple[ToolFacts, ...] = ()
    if layers:  # a managed agent's own policies: the strictest facts of all (proctor.narrowing)
        layer_facts = tuple(layer.policy.facts(name, declared_side_effect, declared_cost) for layer in layers)
        facts = narrow_facts(facts, layer_facts)
    side_effect: SideEffect = facts.side_effect
    if args is not None and type(args) is not dict and not isinstance(args, Mapping):
        return Admission(stage="args", name=name, tool=tool, facts=facts, layer_facts=layer_facts, args={},
                         side_effect=side_effect,
                         refusal=ToolDenied(f"invalid call to {name}: arguments must be a mapping", tool=name))
    if tool is not None:
        try:
            raw = tool.validate(raw)
        except ToolDenied as exc:
            return Admission(stage="args", name=name, tool=tool, facts=facts, layer_facts=layer_facts, args=raw,
                             side_effect=side_effect, refusal=exc)
    # The class depends on the arguments (such a tool's static class is destructive: test that first).
    if side_effect == "destructive" and facts.side_effect_expression is not None:
        try:
            side_effect = policy.side_effect_of(name, raw, declared_side_effect, run.info)
        except ToolDenied as exc:
            return Admission(stage="class", name=name, tool=tool, facts=facts, layer_facts=layer_facts, args=raw,
                             refusal=exc)
        if layer_facts:  # a managed agent's own policies may only make the class worse
            side_effect = max((side_effect, *(f.side_effect for f in layer_facts)), key=side_effect_rank)
    decision, votes = _decide(policy, name, raw, side_effect, facts, run, layers)
    if decision.outcome == "deny":
        return Admission(stage="policy", name=name, tool=tool, facts=facts, layer_facts=layer_facts, args=raw,
                         side_effect=side_effect, decision=decision, votes=votes)
    try:
        cost = _cost(policy, name, raw, declared_cost, facts, layer_facts, layers, run.info)
    except ToolDenied as exc:
        exc.rules = decision.rules
        return Admission(stage="cost", name=name, tool=tool, facts=facts, layer_facts=layer_facts, args=raw,
                         side_effect=side_effect, decision=decision, votes=votes, refusal=exc)
    return Admission(stage="decided", name=name, tool=tool, facts=facts, layer_facts=layer_facts, args=raw,
                     side_effect=side_effect, decision=decision, votes=votes, cost=cost)


def _decide(policy: AdmissionPolicy, name: str, args: Mapping[str, Any], side_effect: SideEffect,
            facts: ToolFacts, run: RunView, layers: Sequence[LayerView]
            ) -> tuple[Decision, tuple[tuple[Any, Decision], ...]]:
    try:
        # Most calls match only rules without conditions: their decision needs no Call built.
        decision = policy.fixed_decision(name, side_effect)
        if decision is None:
            decision = policy.decide(_call(name, args, side_effect, facts, run, run.usage_view()))
        if not layers:
            return decision, ()
        # Each layer's conditions see its own budgets as `usage`; history and run are the run's.
        votes: list[tuple[Any, Decision]] = [(None, decision)]
        for layer in layers:
            vote = layer.policy.fixed_decision(name, side_effect)
            if vote is None:
                vote = layer.policy.decide(_call(name, args, side_effect, facts, run, LazyUsage(layer.ledger)))
            votes.append((layer, vote))
        return narrow_decision(decision, [(layer, vote) for layer, vote in votes[1:]]), tuple(votes)
    except Exception as exc:  # noqa: BLE001 - a policy that raises denies
        return Decision("deny", (), f"the policy could not decide: {exc!r}", policy.sha256), ()


def facts_of(policy: FactSource, name: str, declared_side_effect: SideEffect | None = None,
             declared_cost: int = 0, layers: Sequence[LayerView] = ()) -> ToolFacts:
    """The policy's facts of tool `name` before any call of it is seen: its static class (destructive for
    a class written as an expression over the arguments), cost, limits, labels, redaction — made
    strictest with each managed agent's layer (`proctor.narrowing.narrow_facts`). What `admit` starts
    from, and what an unread call (refused by its size, `Gate.refuse`), prompts, lint and budget
    traces go by."""
    facts = policy.facts(name, declared_side_effect, declared_cost)
    if not layers:
        return facts
    return narrow_facts(facts, [layer.policy.facts(name, declared_side_effect, declared_cost) for layer in layers])


def class_over_args(policy: AdmissionPolicy, name: str, args: Mapping[str, Any], declared: SideEffect | None = None,
                    run: RunInfo | None = None) -> SideEffect:
    """The class of a call of `name` with `args` under the policy's `side_effect:` expression for it
    (ToolDenied when the expression cannot be computed: `admit` refuses such a call at stage "class")."""
    return policy.side_effect_of(name, args, declared, run)


def has_fixed_decision(policy: AdmissionPolicy, name: str, side_effect: SideEffect) -> bool:
    """Whether every call of `name` in class `side_effect` gets the same decision, whatever its arguments
    and run (only rules without conditions match it): a caller may keep that admission for them all."""
    return policy.fixed_decision(name, side_effect) is not None


def decide_call(policy: AdmissionPolicy, call: Call) -> Decision:
    """The rules' decision of `call` (one `call_for` built), before any budget: what `policy explain`
    shows beside a budget's refusal. Raises what the policy raises (explain reports it)."""
    return policy.decide(call)


def call_for(admission: Admission, run: RunView) -> Call:
    """The `Call` the run's policy decided (or would have decided) for `admission`: what `policy explain`
    traces rule by rule. Only for an admission that got its facts (every stage after "tool")."""
    assert admission.facts is not None
    return _call(admission.name, admission.args, admission.side_effect, admission.facts, run, run.usage_view())


def _call(name: str, args: Mapping[str, Any], side_effect: SideEffect, facts: ToolFacts, run: RunView,
          usage: Mapping[str, Any]) -> Call:
    return Call(tool=name, args=args, side_effect=side_effect, cost=facts.cost, history=run.history_view(),
                run=run.info, usage=usage, seen=run.seen_labels(), provenance=run.provenance)


def _cost(policy: AdmissionPolicy, name: str, args: Mapping[str, Any], declared_cost: int, facts: ToolFacts,
          layer_facts: Sequence[ToolFacts], layers: Sequence[LayerView], info: RunInfo) -> float:
    """The call's cost for its budgets (a policy may compute it from the arguments: raises ToolDenied).
    Under managed agents' own policies, the highest of every policy's cost."""
    if facts.cost_expression is None:
        return facts.cost
    costs = [float(policy.cost_of(name, args, declared_cost, info))]
    for layer, own in zip(layers, layer_facts, strict=True):
        costs.append(float(own.cost) if own.cost_expression is None
                     else float(layer.policy.cost_of(name, args, declared_cost, info)))
    return max(costs)
