"""proctor.narrowing: a managed agent's own policy only ever makes facts, decisions and budgets stricter."""

from __future__ import annotations

import pytest

from proctor.calls import Decision, RunInfo
from proctor.errors import BudgetExceeded
from proctor.narrowing import Layer, StackedLedger, narrow_decision, narrow_facts
from proctor.policy import Policy


def _policy(**data: object) -> Policy:
    return Policy.from_dict({"version": 1, "default": "allow", **data})


def test_facts_take_the_worst_of_every_policy() -> None:
    """Side effect, cost, timeout, redaction, labels and durability: the strictest wins, whatever the order."""
    run = _policy(tools={"send": {"side_effect": "external", "cost": 1, "timeout": "30s", "redact": ["a"]}})
    own = _policy(tools={"send": {"side_effect": "none", "cost": 5, "timeout": "2s", "redact": ["b"],
                                  "labels": ["private"]}})
    facts = narrow_facts(run.facts("send"), [own.facts("send")])
    assert facts.side_effect == "external" and facts.cost == 5 and facts.timeout_s == 2.0
    assert facts.redact == ("a", "b") and facts.labels == ("private",) and facts.durability == "fsync"
    worse = narrow_facts(own.facts("send"), [run.facts("send")])
    assert worse.side_effect == "external"


def test_decisions_combine_towards_refusal_and_name_the_layer() -> None:
    """deny beats require_approval beats allow; a layer's rules are prefixed with its agent's name."""
    base = Decision("allow", ("reads",), "ok", "sha")
    layer = Layer("researcher", None, None)
    asked = narrow_decision(base, [(layer, Decision("require_approval", ("ask",), "mine", "other"))])
    assert asked.outcome == "require_approval" and asked.rules == ("reads", "researcher:ask")
    assert asked.reason == "researcher's own policy: mine" and asked.policy_sha256 == "sha"
    denied = Decision("deny", ("no",), "run says no", "sha")
    assert narrow_decision(denied, [(layer, Decision("allow", (), "fine", "x"))]).outcome == "deny"


def test_stacked_ledger_reserves_on_both_or_neither() -> None:
    """A call refused by the agent's own budget gives back what the run's ledger had counted."""
    run = _policy(budgets=[{"name": "run-calls", "limit": {"calls": 5}}]).new_ledger(RunInfo())
    own = _policy(budgets=[{"name": "mine", "limit": {"calls": 1}}]).new_ledger(RunInfo())
    stacked = StackedLedger(run, own, agent="researcher")
    first = stacked.reserve("t", "read", 0)
    stacked.settle(first, duration_ns=1)
    with pytest.raises(BudgetExceeded, match="mine"):
        stacked.reserve("t", "read", 0)
    assert run.usage()["run-calls"]["calls"] == 1 and stacked.usage()["mine"]["calls"] == 1


def test_stacked_ledger_usage_cannot_mask_the_runs_budget() -> None:
    """An own budget named like one of the run's does not hide the run's usage from the run's conditions."""
    run = _policy(budgets=[{"name": "calls", "limit": {"calls": 5}}]).new_ledger(RunInfo())
    own = _policy(budgets=[{"name": "calls", "limit": {"calls": 50}}]).new_ledger(RunInfo())
    stacked = StackedLedger(run, own)
    for _ in range(3):
        run.settle(run.reserve("t", "read", 0), duration_ns=1)
    assert stacked.usage()["calls"]["calls"] == 3 and stacked.remaining()["calls"]["calls"] == 2


def test_stacked_ledger_refuses_after_its_deadline_and_keeps_the_parents_step() -> None:
    """Past the deadline every reservation is refused; next_step starts only the agent's own step budgets."""
    run = _policy(budgets=[{"name": "step", "per": "step", "limit": {"calls": 1}}]).new_ledger(RunInfo())
    run.settle(run.reserve("t", "read", 0), duration_ns=1)
    stacked = StackedLedger(run, None, agent="researcher", deadline=0.0, timeout_s=3)
    stacked.next_step()  # the parent's step is still going on: its per-step budget stays used
    assert run.usage()["step"]["calls"] == 1
    with pytest.raises(BudgetExceeded, match=r"time given to managed agent 'researcher' \(3s\) is up"):
        stacked.reserve("t", "read", 0)
