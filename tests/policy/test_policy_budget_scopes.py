"""Budgets with `per:` principal, label:KEY, global and fixed `window:`s, in one process."""

from __future__ import annotations

from typing import Any

import pytest

from proctor.calls import RunInfo
from proctor.errors import BudgetExceeded, PolicyError
from proctor.ledger import MemoryLedger
from proctor.policy import Ledger, Policy


class WallClock:
    """A hand-driven wall clock in seconds."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def ledgers(budgets: list[dict[str, Any]], *runs: RunInfo, clock: WallClock | None = None) -> list[Ledger]:
    policy = Policy.from_dict({"version": 1, "budgets": budgets})
    shared = MemoryLedger()
    wall = clock or WallClock()
    return [Ledger(policy.budgets, run=run, shared=shared, wall_clock=wall) for run in runs]


def test_global_budget_is_one_pool_for_every_run() -> None:
    """Two runs drawing on a global budget of 3 get three calls between them."""
    a, b = ledgers([{"name": "g", "per": "global", "limit": {"calls": 3}}], RunInfo("r1"), RunInfo("r2"))
    a.reserve("t", "read", 0)
    b.reserve("t", "read", 0)
    a.reserve("t", "read", 0)
    with pytest.raises(BudgetExceeded, match="budget 'g' exhausted for all runs: 3 of 3 calls used"):
        b.reserve("t", "read", 0)


def test_principal_budget_is_one_pool_per_principal() -> None:
    """Runs of alice share one pool; bob has his own."""
    a1, a2, b = ledgers([{"name": "p", "per": "principal", "limit": {"calls": 1}}],
                        RunInfo("r1", principal="alice"), RunInfo("r2", principal="alice"),
                        RunInfo("r3", principal="bob"))
    a1.reserve("t", "read", 0)
    with pytest.raises(BudgetExceeded, match="for principal alice"):
        a2.reserve("t", "read", 0)
    b.reserve("t", "read", 0)
    assert a2.usage()["p"]["calls"] == 1 and b.remaining()["p"] == {"calls": 0}


def test_label_budget_is_one_pool_per_label_value() -> None:
    """per: label:team pools runs by the value of their team label; runs without it share one pool."""
    spec = [{"name": "team", "per": "label:team", "limit": {"cost": 10}}]
    x1, x2, y, none1, none2 = ledgers(spec, RunInfo("1", labels={"team": "x"}), RunInfo("2", labels={"team": "x"}),
                                      RunInfo("3", labels={"team": "y"}), RunInfo("4"), RunInfo("5"))
    x1.reserve("t", "read", 6)
    with pytest.raises(BudgetExceeded, match="label team=x"):
        x2.reserve("t", "read", 6)
    y.reserve("t", "read", 10)
    none1.reserve("t", "read", 10)
    with pytest.raises(BudgetExceeded, match="runs without label team"):
        none2.reserve("t", "read", 1)


def test_release_and_settle_reach_the_shared_pool() -> None:
    """A released call is given back to the pool; a settled one corrects its cost there."""
    a, b = ledgers([{"name": "g", "per": "global", "limit": {"calls": 1, "cost": 5}}], RunInfo("1"), RunInfo("2"))
    r = a.reserve("t", "read", 5)
    a.release(r)
    r = b.reserve("t", "read", 5)
    b.settle(r, duration_ns=1000, cost=2)
    assert a.usage()["g"]["cost"] == 2 and a.usage()["g"]["calls"] == 1


def test_window_starts_a_shared_budget_afresh() -> None:
    """A global budget with window 1h refuses within the hour and allows again in the next."""
    clock = WallClock(3600 * 10 + 5)
    (a,) = ledgers([{"name": "hourly", "per": "global", "window": "1h", "limit": {"calls": 1}}], RunInfo("1"),
                   clock=clock)
    a.reserve("t", "read", 0)
    clock.now += 3000
    with pytest.raises(BudgetExceeded, match="window 3600s"):
        a.reserve("t", "read", 0)
    clock.now += 700  # the next hour
    a.reserve("t", "read", 0)
    assert a.usage()["hourly"]["calls"] == 1


def test_window_starts_a_run_budget_afresh_and_late_settles_stay_in_their_window() -> None:
    """A per-run windowed budget resets at the window edge; releasing an old reservation leaves the new window."""
    clock = WallClock(60 * 100)
    (a,) = ledgers([{"name": "per-minute", "window": "1m", "limit": {"calls": 2}}], RunInfo("1"), clock=clock)
    old = a.reserve("t", "read", 0)
    a.reserve("t", "read", 0)
    with pytest.raises(BudgetExceeded, match="this window"):
        a.reserve("t", "read", 0)
    clock.now += 60
    a.reserve("t", "read", 0)
    a.release(old)
    assert a.usage()["per-minute"]["calls"] == 1


def test_shared_model_budget_counts_every_run_of_the_principal() -> None:
    """model_cost_usd per principal adds up the replies of all of alice's runs."""
    a, b = ledgers([{"name": "spend", "per": "principal", "limit": {"model_cost_usd": 1.0}}],
                   RunInfo("1", principal="alice"), RunInfo("2", principal="alice"))
    a.charge_model(100, 0.6)
    b.check_model()
    b.charge_model(100, 0.6)
    with pytest.raises(BudgetExceeded, match="model cost used"):
        a.check_model()


def test_unknown_scope_and_window_on_step_are_load_errors() -> None:
    """per: team and a windowed per-step budget are refused with their line and column."""
    with pytest.raises(PolicyError, match=r"5:10: budget 'b': unknown per 'team'"):
        Policy.from_string("version: 1\nbudgets:\n  - name: b\n    limit: {calls: 1}\n    per: team\n")
    with pytest.raises(PolicyError, match="per: step budget starts afresh every step: remove window"):
        Policy.from_dict({"version": 1, "budgets": [{"name": "b", "per": "step", "window": "1h",
                                                      "limit": {"calls": 1}}]})
    with pytest.raises(PolicyError, match="window: '10ms' is shorter than 1s"):
        Policy.from_dict({"version": 1, "budgets": [{"name": "b", "per": "global", "window": "10ms",
                                                      "limit": {"calls": 1}}]})


def test_gates_of_one_process_share_the_default_ledger() -> None:
    """Two gates without a ledger argument draw on the same global pool (the process's MemoryLedger), which a
    policy saying `ledger: local` means."""
    from proctor import Gate, tool

    @tool(side_effect="read")
    def ping() -> str:
        """Ping."""
        return "pong"

    policy = Policy.from_dict({"version": 1, "default": "allow", "ledger": "local", "budgets": [
        {"name": "fleet-test-global-pings", "per": "global", "limit": {"calls": 1}}]})
    g1, g2 = Gate(policy, tools=[ping]), Gate(policy, tools=[ping])
    assert g1.ledger is g2.ledger
    assert g1.call("ping") == "pong"
    with pytest.raises(BudgetExceeded):
        g2.call("ping")


POLICY = """\
version: 1
default: allow
budgets:
  - name: wires
    match: {tool: wire}
    per: global
    window: 24h
    limit: {calls: 100}
  - name: spend
    per: principal
    window: 24h
    limit: {cost: 500}
"""


def test_policy_check_lists_each_budget_with_scope_and_window(tmp_path: Any, capsys: Any) -> None:
    """policy check prints every budget's limits, scope and window, and says shared ones need a shared ledger."""
    from proctor.cli import main

    path = tmp_path / "p.yaml"
    path.write_text(POLICY)
    assert main(["policy", "check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "budget wires: calls 100, global, every 86400s (fixed windows), for tool wire" in out
    assert "budget spend: cost 500, per principal, every 86400s (fixed windows)" in out
    assert "--ledger redis://" in out


def test_policy_explain_shows_the_pool_and_a_refusal_from_usage(tmp_path: Any, capsys: Any) -> None:
    """explain --usage names the pool a call counts in and the budget that would refuse it."""
    from proctor.cli import main

    path = tmp_path / "p.yaml"
    path.write_text(POLICY)
    code = main(["policy", "explain", str(path), "--tool", "wire", "--run", '{"principal": "alice"}',
                 "--usage", '{"wires": {"calls": 100}}'])
    out = capsys.readouterr().out
    assert code == 0
    assert "✘ wires counts it, global, window 86400s (from " in out
    assert "[pool wires|global|w=" in out and "would refuse, budget 'wires' exhausted: 100 of 100 calls used" in out
    assert "✔ spend counts it, per principal alice" in out


def test_policy_test_checks_budget_expectations(tmp_path: Any, capsys: Any) -> None:
    """Cases may expect the refusing budget (shared ones too) and the budgets counting a call; a wrong one fails."""
    from proctor.cli import main

    path, cases = tmp_path / "p.yaml", tmp_path / "cases.yaml"
    path.write_text(POLICY)
    cases.write_text(
        "- {tool: wire, expect: allow, budgets: [wires, spend]}\n"
        "- {tool: wire, expect: deny, usage: {wires: {calls: 100}}, budget: wires}\n"
        "- {tool: wire, expect: deny, run: {principal: bob}, usage: {spend: {cost: 500}}, side_effect: write,\n"
        "   cost: 1, budget: spend}\n"
        "- {tool: read, expect: allow, budgets: [spend]}\n"
    )
    assert main(["policy", "test", str(path), str(cases)]) == 0, capsys.readouterr().out
    cases.write_text("- {tool: read, expect: allow, budgets: [wires]}\n")
    assert main(["policy", "test", str(path), str(cases)]) == 1
    assert "counted by [spend]" in capsys.readouterr().out
