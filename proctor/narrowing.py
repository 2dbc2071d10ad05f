"""Narrowing: a managed agent's own policy can only take away from its parent's.

A managed agent works inside its parent's run (`proctor.gate.run.AgentContext`). Every call it
makes is decided by the run's policy first — the gate's, with `run.agent` naming the managed
agent — and then by the own policy of each managed agent in the chain (a `Layer`), and the
strictest answer wins: deny beats require_approval beats allow. This is structural, not a
convention: the gate has no path that skips the run's policy, and a layer's answer is only
ever combined towards refusal.

- facts: the worst side-effect class, the highest cost, the shortest timeout, the union of
  redacted fields and labels, fsync if any layer asks for it (`narrow_facts`);
- budgets: the call is reserved on the run's ledger *and* the layer's (`StackedLedger`): the
  run's budgets count every call of the whole tree, a layer's only its agent's;
- approvals: a call needs the approval of each policy that asks for one — the run's from the
  gate's approver, a layer's from that agent's approver (or the gate's when it has none);
  grants given by a layer's approver answer only that layer (`Layer.grants`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from proctor.calls import BudgetHold, Decision, SideEffect, side_effect_rank
from proctor.errors import BudgetExceeded

if TYPE_CHECKING:
    from proctor.approval.base import Approver, Grant
    from proctor.gate.gate import PolicyLike
    from proctor.gate.run import Ledger
    from proctor.policy.engine import ToolFacts

__all__ = ["Layer", "StackedLedger", "narrow_decision", "narrow_facts"]

_OUTCOME_RANK = {"allow": 0, "require_approval": 1, "deny": 2}


@dataclass(eq=False)
class Layer:
    """A managed agent's own policy, budgets and approver, applied on top of the run's."""

    agent: str
    policy: PolicyLike  # a proctor.Policy
    ledger: Ledger  # that policy's ledger for this invocation (a proctor.policy.budgets.Ledger)
    approver: Approver | None = None  # the agent's own approver; None: the gate's answers this layer too
    #: Grants given by `approver` in this invocation: they answer this layer's approvals only.
    grants: list[Grant] = field(default_factory=list)


def narrow_facts(base: ToolFacts, others: Sequence[ToolFacts]) -> ToolFacts:
    """`base` (the run policy's facts of a tool) made strictest with each layer's facts of it."""
    if not others:
        return base
    try:
        fields(base)
    except TypeError:  # not a dataclass: facts the gate cannot rebuild stay as the run policy gave them
        return base
    every = (base, *others)
    timeouts = [f.timeout_s for f in every if f.timeout_s is not None]
    limits = [f.max_arg_bytes for f in every if f.max_arg_bytes]
    # Any layer computing the cost from the arguments sends the gate to the highest of every policy's cost.
    cost_expression = base.cost_expression or next((o.cost_expression for o in others
                                                    if o.cost_expression is not None), None)
    return replace(base, side_effect=max((f.side_effect for f in every), key=side_effect_rank),
                   cost=max(f.cost for f in every), timeout_s=min(timeouts) if timeouts else None,
                   redact=_union(*(f.redact for f in every)),
                   durability="flush" if all(f.durability == "flush" for f in every) else "fsync",
                   labels=_union(*(f.labels for f in every)),
                   hide_from_approvers=_union(*(f.hide_from_approvers for f in every)),
                   max_arg_bytes=min(limits) if limits else None, cost_expression=cost_expression)


def _union(*groups: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(x for g in groups for x in g))


def narrow_decision(base: Decision, parts: Sequence[tuple[Layer, Decision]]) -> Decision:
    """The strictest of the run policy's decision and each layer's; rules of a layer are named ``agent:rule``."""
    outcome, reason = base.outcome, base.reason
    rules = list(base.rules)
    for layer, decision in parts:
        rules.extend(f"{layer.agent}:{rule}" for rule in decision.rules)
        if _OUTCOME_RANK[decision.outcome] > _OUTCOME_RANK[outcome]:
            outcome, reason = decision.outcome, f"{layer.agent}'s own policy: {decision.reason}"
    return Decision(outcome, tuple(rules), reason, base.policy_sha256)


@dataclass(frozen=True, slots=True)
class StackedHold(BudgetHold):
    """A managed agent's call held on both ledgers: the parent's (`first`) and its own policy's (`second`)."""

    first: BudgetHold
    second: BudgetHold | None


class StackedLedger:
    """The budgets a managed agent's call is counted against: its parent's (the run's, so a run-wide
    limit holds for the whole tree) and its own policy's, reserved together or not at all; and
    its deadline, past which every reservation is refused.

    `next_step` starts only the agent's own `per: step` budgets: the parent's step is still going on.
    """

    def __init__(self, base: Ledger, own: Ledger | None = None, *, agent: str = "", deadline: float | None = None,
                 timeout_s: float | None = None) -> None:
        self.base, self.own, self.agent, self.deadline, self.timeout_s = base, own, agent, deadline, timeout_s

    def time_left(self) -> float | None:
        """Seconds before the deadline (negative once passed), or None without one."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    def reserve(self, tool: str, side_effect: SideEffect, cost: float) -> StackedHold:
        left = self.time_left()
        if left is not None and left <= 0:
            given = f" ({self.timeout_s:g}s)" if self.timeout_s is not None else ""
            raise BudgetExceeded(f"{tool}: refused: the time given to managed agent {self.agent!r}{given} is up",
                                 tool=tool)
        first = self.base.reserve(tool, side_effect, cost)
        if self.own is None:
            return StackedHold(first, None)
        try:
            second = self.own.reserve(tool, side_effect, cost)
        except BaseException:
            self.base.release(first)
            raise
        return StackedHold(first, second)

    def settle(self, hold: BudgetHold, *, duration_ns: int, cost: float | None = None) -> None:
        held = StackedHold.given_back(hold, "StackedLedger")
        first, second = held.first, held.second
        try:
            self.base.settle(first, duration_ns=duration_ns, cost=cost)
        finally:
            if second is not None and self.own is not None:
                self.own.settle(second, duration_ns=duration_ns, cost=cost)

    def release(self, hold: BudgetHold) -> None:
        held = StackedHold.given_back(hold, "StackedLedger")
        first, second = held.first, held.second
        try:
            self.base.release(first)
        finally:
            if second is not None and self.own is not None:
                self.own.release(second)

    def usage(self) -> dict[str, dict[str, Any]]:
        """Both ledgers' usage; on a shared name the run's wins (the agent's policy cannot mask it)."""
        return {**(self.own.usage() if self.own is not None else {}), **self.base.usage()}

    def remaining(self) -> dict[str, dict[str, Any]]:
        return {**(self.own.remaining() if self.own is not None else {}), **self.base.remaining()}

    def spend(self, hold: BudgetHold) -> dict[str, dict[str, Any]]:
        """What the call takes from each budget of both ledgers (on a shared name, the run's)."""
        held = StackedHold.given_back(hold, "StackedLedger")
        first, second = held.first, held.second
        own = self.own.spend(second) if self.own is not None and second is not None else {}
        return {**own, **self.base.spend(first)}

    def next_step(self) -> None:
        if self.own is not None:
            self.own.next_step()

    def replay(self, tool: str, side_effect: SideEffect, cost: float, duration_ns: int) -> None:
        """A call replayed on resume counts in both ledgers' own budgets, as it did when it ran; never refused,
        the deadline included (it ran before)."""
        self.base.replay(tool, side_effect, cost, duration_ns)
        if self.own is not None:
            self.own.replay(tool, side_effect, cost, duration_ns)

    def snapshot(self) -> dict[str, Any]:
        """Both ledgers' snapshots (the run's under ``base``, the agent's own under ``own``)."""
        return {"base": self.base.snapshot(), "own": self.own.snapshot() if self.own is not None else None}

    def restore(self, snapshot: Mapping[str, Any]) -> None:
        """Continue from `snapshot()`; a part that is missing leaves its ledger as it is."""
        base, own = snapshot.get("base"), snapshot.get("own")
        if isinstance(base, Mapping):
            self.base.restore(base)
        if self.own is not None and isinstance(own, Mapping):
            self.own.restore(own)

    def charge_model(self, tokens: int, cost_usd: float, *, shared: bool = True) -> None:
        """Model use of the managed agent counts in the run's model budgets too."""
        self.base.charge_model(tokens, cost_usd, shared=shared)
        if self.own is not None:
            self.own.charge_model(tokens, cost_usd, shared=shared)

    def check_model(self) -> None:
        self.base.check_model()
        if self.own is not None:
            self.own.check_model()

    def own_usage(self) -> Mapping[str, Any]:
        """The agent's own policy's usage (what its conditions see as `usage`)."""
        return self.own.usage() if self.own is not None else {}
