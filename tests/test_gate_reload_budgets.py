"""A reloaded policy decides a run's next call whole: its budgets count the run's calls too.

Before, a run counted its calls on the ledger of the policy it started with for its whole life,
so a budget added or tightened by a reload never refused a run already going (the docs promise
"runs in flight switch at their next call"), and a call was decided by one policy's rules and
another's budgets.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from policy_files import FlippingPolicy, replace_file

from proctor.errors import BudgetExceeded, ToolDenied
from proctor.gate import Gate
from proctor.policy.reload import PolicySource
from proctor.testing import InMemoryAudit
from proctor.tools import tool

BASE: dict[str, Any] = {"version": 1, "default": "deny",
                        "rules": [{"name": "reads", "match": {"side_effect": "read"}, "decision": "allow"}]}


@tool(side_effect="read")
def fetch(url: str) -> str:
    """Fetch a page.

    Args:
        url: Where.
    """
    return "page"


def _write(path: Path, data: dict[str, Any]) -> None:
    replace_file(path, yaml.safe_dump(data))
    time.sleep(0.01)


def _calls(gate: Gate, ctx: Any, n: int) -> list[str]:
    out = []
    for _ in range(n):
        try:
            gate.call("fetch", {"url": "u"}, context=ctx)
            out.append("ok")
        except BudgetExceeded as exc:
            out.append(f"refused by {exc.budget}")
    return out


def test_a_budget_tightened_by_a_reload_refuses_a_run_in_flight_on_the_use_it_already_had(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    _write(path, {**BASE, "budgets": [{"name": "run-calls", "limit": {"calls": 100}}]})
    audit = InMemoryAudit()
    gate = Gate(PolicySource(path, check_every_ms=0), tools=[fetch], audit=audit)
    ctx = gate.start_run()
    assert _calls(gate, ctx, 3) == ["ok"] * 3
    _write(path, {**BASE, "budgets": [{"name": "run-calls", "limit": {"calls": 4}}]})
    assert _calls(gate, ctx, 2) == ["ok", "refused by run-calls"]
    # The refusal names the policy that decided it: the new one, whole.
    intents = audit.of_kind("call_intent")
    (change,) = audit.of_kind("policy_changed")
    assert intents[-1]["policy_sha256"] == change["new_sha256"]


def test_a_budget_added_by_a_reload_counts_a_run_in_flight_from_the_change_on(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    _write(path, BASE)
    gate = Gate(PolicySource(path, check_every_ms=0), tools=[fetch], audit=InMemoryAudit())
    ctx = gate.start_run()
    assert _calls(gate, ctx, 5) == ["ok"] * 5
    _write(path, {**BASE, "budgets": [{"name": "two-more", "limit": {"calls": 2}}]})
    assert _calls(gate, ctx, 3) == ["ok", "ok", "refused by two-more"]


def test_a_run_pinned_by_reload_new_runs_keeps_its_budgets_too(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    _write(path, {**BASE, "reload": "new_runs", "budgets": [{"name": "run-calls", "limit": {"calls": 3}}]})
    gate = Gate(PolicySource(path, check_every_ms=0), tools=[fetch], audit=InMemoryAudit())
    ctx = gate.start_run()
    assert _calls(gate, ctx, 1) == ["ok"]
    _write(path, {**BASE, "reload": "new_runs", "budgets": [{"name": "run-calls", "limit": {"calls": 100}}]})
    assert _calls(gate, ctx, 3) == ["ok", "ok", "refused by run-calls"]  # the policy it started with, whole
    assert _calls(gate, gate.start_run(), 4) == ["ok"] * 4


def test_a_reload_to_cross_run_budgets_on_a_local_ledger_refuses_the_runs_next_call_saying_why(tmp_path: Path) -> None:
    """What a run's start refuses (a per-principal budget counted by one process only) refuses a call too."""
    path = tmp_path / "policy.yaml"
    _write(path, BASE)
    gate = Gate(PolicySource(path, check_every_ms=0), tools=[fetch], audit=InMemoryAudit())
    ctx = gate.start_run(principal="alice")
    _write(path, {**BASE, "budgets": [{"name": "per-person", "per": "principal", "limit": {"calls": 5}}]})
    with pytest.raises(ToolDenied, match="process-local"):
        gate.call("fetch", {"url": "u"}, context=ctx)


def test_a_resumed_run_under_reload_new_runs_keeps_the_policy_its_run_resumed_names(tmp_path: Path) -> None:
    """`reload: new_runs` keeps a run on the policy it started with; a durable run resumed in this process starts
    here with the policy its `run_resumed` record names. A deploy between the resume and the run's first call
    must not pin it to another one (the resume asked the file, then the first call asked it again)."""
    from proctor.calls import RunInfo

    pinned = {**BASE, "reload": "new_runs"}
    other = {**pinned, "budgets": [{"name": "tight", "limit": {"calls": 0}}]}
    audit = InMemoryAudit()
    flipping = FlippingPolicy(tmp_path / "policy.yaml", (yaml.safe_dump(pinned), yaml.safe_dump(other)))
    gate = Gate(flipping, audit=audit, tools=[fetch])
    ctx = gate.resume_run(RunInfo(id="run_resumed1", principal="alice"))
    outcomes = _calls(gate, ctx, 3)
    [resumed] = [r for r in audit.records if r["kind"] == "run_resumed"]
    intents = [r["policy_sha256"] for r in audit.records if r["kind"] == "call_intent"]
    assert intents == [resumed["policy_sha256"]] * 3, (outcomes, resumed["policy_sha256"], intents)
