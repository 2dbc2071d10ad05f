"""Decide a call as the gate would, without running anything: `policy test` and `policy explain`.

The gate validates a call's arguments against the tool's schema (completing defaults)
before the policy sees them, adds the labels of every call that ran to the run's
`seen`, computes the call's cost and reserves its budgets. `decide_like_gate` does the
same steps in the same order, on the same code:

    (tools given) validate + complete args and history args → policy.decide
        → (not denied) cost → reserve on a ledger preloaded with `usage`

With `layers` (managed agents' own policies, outermost first) the call is decided as one a
managed agent makes: `admit` narrows facts and decision by each, and the budgets are reserved
on the run's ledger and each layer's own (fresh) ledger together, as `StackedLedger` does.

Without tools the arguments are taken as written and `Simulation.defaults_applied` is
False, so the commands can say that schema defaults were not applied.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from proctor.calls import Call, Decision, HistoryEntry, RunInfo
from proctor.errors import BudgetExceeded, SimulationError, ToolDenied
from proctor.ledger.memory import MemoryLedger
from proctor.narrowing import Layer, StackedLedger
from proctor.policy.admission import admit, call_for, class_over_args, facts_of

if TYPE_CHECKING:
    from proctor.policy.engine import Policy
    from proctor.provenance import ProvenanceIndex
    from proctor.tools import Tool

__all__ = ["RAN_STATUSES", "RecordedRun", "Simulation", "SimulationError", "complete_history", "decide_like_gate"]

#: A call with one of these statuses started its tool: its labels are in `seen` (as `RunContext` keeps it).
RAN_STATUSES = frozenset(("ok", "failed", "timeout", "unknown"))


@dataclass(frozen=True, slots=True)
class Simulation:
    """The gate's verdict on a call: its decision, the budget that refused it (if one did), the call decided."""

    decision: Decision
    call: Call
    side_effect: str
    budget: str | None = None
    cost: float = 0
    defaults_applied: bool = False


def complete_history(
    policy: Policy, history: Sequence[HistoryEntry], tools: Mapping[str, Tool] | None
) -> tuple[tuple[HistoryEntry, ...], tuple[str, ...]]:
    """The entries as the gate would have recorded them (validated args, the policy's labels), and `seen`."""
    out: list[HistoryEntry] = []
    seen: set[str] = set()
    for i, entry in enumerate(history):
        args: Mapping[str, Any] = entry.args
        side_effect = entry.side_effect
        declared_cost = 0
        tool = tools.get(entry.tool) if tools is not None else None
        if tools is not None and tool is None:
            if entry.status != "denied" or entry.args:  # the gate records an unknown tool's call as denied, no args
                known = ", ".join(sorted(tools))
                raise SimulationError(f"history[{i}]: unknown tool {entry.tool!r} (known: {known}); a call to an "
                                      "unknown tool is recorded with status denied and no args", i)
            side_effect = "destructive"
        elif tool is not None:
            if entry.status != "denied" or entry.args:
                try:
                    args = tool.validate(entry.args)
                except ToolDenied as exc:
                    raise SimulationError(f"history[{i}]: {exc}", i) from None
            declared_cost = tool.cost
            side_effect = _class_of(policy, entry.tool, args, tool.side_effect, declared_cost)
        elif tools is None:  # the policy's `tools:` overrides the class the entry declares, as the gate's facts do
            side_effect = _class_of(policy, entry.tool, args, entry.side_effect, declared_cost)
        labels = entry.labels or (() if tools is not None and tool is None
                                  else facts_of(policy, entry.tool, None, declared_cost).labels)
        out.append(replace(entry, args=args, side_effect=side_effect, labels=labels))
        if entry.status in RAN_STATUSES:
            seen.update(labels)
    return tuple(out), tuple(sorted(seen))


@dataclass(frozen=True, slots=True)
class RecordedRun:
    """A run as `policy test` and replay know it: what a decision reads, given rather than kept (`RunView`)."""

    info: RunInfo
    history: Sequence[HistoryEntry]
    seen: Sequence[str]
    usage: Mapping[str, Any]
    provenance: ProvenanceIndex | None = None

    def history_view(self) -> Sequence[HistoryEntry]:
        return self.history

    def seen_labels(self) -> Sequence[str]:
        return self.seen

    def usage_view(self) -> Mapping[str, Any]:
        return self.usage


def decide_like_gate(
    policy: Policy,
    call: Call,
    tools: Mapping[str, Tool] | Iterable[Tool] | None = None,
    usage: Mapping[str, Mapping[str, float]] | None = None,
    layers: Sequence[tuple[str, Policy]] = (),
) -> Simulation:
    """Decide `call` with `policy` as a `Gate` holding `tools` does — through the same `admit` — with
    budgets preloaded with `usage`, then reserve its budgets as the gate would.

    `layers` are (agent, policy) pairs: the call is made by the last agent of that chain of
    managed agents, each narrowing with its own policy and counting on its own budgets (which
    start empty: `usage` is the run's). `call.run` should then name that agent, as the gate's does.

    Raises `SimulationError` for inputs the gate could never have seen (a history entry
    whose arguments its tool refuses, an unknown budget in `usage`).
    """
    by_name = _tools(tools)
    # A ledger of its own: shared budgets (principal, label, global) start from `usage`, never from
    # (and never charging) the pools of real runs in this process.
    ledger = policy.new_ledger(call.run, MemoryLedger())
    try:
        ledger.preload(usage or {})
    except ValueError as exc:
        raise SimulationError(f"usage: {exc}") from None
    # Each managed agent's own budgets, reserved together with the run's (proctor.narrowing).
    own = [Layer(agent, layer, layer.new_ledger(call.run, MemoryLedger())) for agent, layer in layers]
    stacked: Any = ledger
    for layer in own:
        stacked = StackedLedger(stacked, layer.ledger, agent=layer.agent)
    history, seen = complete_history(policy, call.history, by_name)
    run = RecordedRun(call.run, history, call.seen or seen, stacked.usage(), call.provenance)
    adm = admit(policy, call.tool, call.args, tools=by_name, run=run, layers=own,
                declared_side_effect=call.side_effect, declared_cost=call.cost or 0)
    applied = by_name is not None
    decided = call_for(adm, run) if adm.facts is not None else call
    if adm.decision is None:  # refused before the policy decided: unknown tool, arguments, class
        refusal = Decision("deny", (), str(adm.refusal), policy.sha256)
        return Simulation(refusal, decided, "destructive" if adm.stage == "class" else adm.side_effect,
                          defaults_applied=applied)
    decision = adm.decision
    if adm.stage == "policy":
        return Simulation(decision, decided, adm.side_effect, defaults_applied=applied)
    if adm.stage == "cost":
        return Simulation(replace(decision, outcome="deny", reason=str(adm.refusal)), decided, adm.side_effect,
                          defaults_applied=applied)
    try:
        stacked.reserve(call.tool, adm.side_effect, adm.cost)
    except BudgetExceeded as exc:
        refused = Decision("deny", decision.rules, str(exc), policy.sha256)
        return Simulation(refused, decided, adm.side_effect, budget=exc.budget, cost=adm.cost,
                          defaults_applied=applied)
    return Simulation(decision, decided, adm.side_effect, cost=adm.cost, defaults_applied=applied)


def _class_of(policy: Policy, tool: str, args: Mapping[str, Any], declared: Any, declared_cost: int) -> Any:
    """The class the gate recorded for an earlier call (its expression over the args; destructive if it failed)."""
    if tool in policy.dynamic_side_effects:
        try:
            return class_over_args(policy, tool, args, declared)
        except ToolDenied:
            return "destructive"
    return facts_of(policy, tool, declared, declared_cost).side_effect


def _tools(tools: Mapping[str, Tool] | Iterable[Tool] | None) -> dict[str, Tool] | None:
    if tools is None:
        return None
    if isinstance(tools, Mapping):
        return dict(tools)
    return {t.name: t for t in tools}
