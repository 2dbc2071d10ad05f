"""A budget's scope is never silently narrower than written (issue 34.3).

A policy with a `per: principal`, `per: label:KEY` or `per: global` budget starts a gate only on a
shared ledger, unless a process-local one is said to be meant (the policy's `ledger: local`, or
the gate's `ledger="local"`), which the audit log's `run_started` record and the run summary state.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from proctor import CodeAgent, Gate, Policy, ScriptedModel, tool
from proctor.audit import AuditLog
from proctor.errors import ConfigurationError, PolicyError
from proctor.ledger import MemoryLedger, ledger_scope
from proctor.testing import InMemoryAudit


@tool(side_effect="external")
def page(who: str) -> str:
    """Page someone.

    Args:
        who: Who to page.
    """
    return f"paged {who}"


def _policy(per: str, **top: Any) -> Policy:
    return Policy.from_dict({"version": 1, "default": "allow", **top, "budgets": [
        {"name": "pages", "match": {"tool": "page"}, "per": per, "window": "1h", "limit": {"calls": 3}},
        {"name": "run-calls", "limit": {"calls": 50}}]})


@pytest.fixture(autouse=True)
def _no_ledger_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROCTOR_LEDGER", raising=False)


@pytest.mark.parametrize("per", ["global", "principal", "label:team"])
def test_a_cross_run_budget_refuses_a_gate_on_the_process_local_ledger(per: str) -> None:
    """Without a shared ledger and without `ledger: local`, the gate does not start; one line names the fix."""
    with pytest.raises(ConfigurationError) as caught:
        Gate(_policy(per), tools=[page])
    message = str(caught.value)
    assert "\n" not in message
    assert f"'pages' (per {per}, window 3600s)" in message and "process-local" in message
    assert "PROCTOR_LEDGER=redis://" in message and "ledger='redis://" in message
    assert "`ledger: local`" in message
    assert "run-calls" not in message  # a per-run budget is counted by its run wherever it runs


def test_run_and_step_budgets_need_no_shared_ledger() -> None:
    """A policy whose budgets are all per run or per step starts on the local ledger, and says nothing of it."""
    policy = Policy.from_dict({"version": 1, "default": "allow", "budgets": [
        {"name": "calls", "limit": {"calls": 5}}, {"name": "steps", "per": "step", "limit": {"calls": 2}}]})
    audit = InMemoryAudit()
    gate = Gate(policy, tools=[page], audit=audit)
    gate.start_run()
    assert gate.ledger_scope.summary is None
    (started,) = audit.of_kind("run_started")
    assert "ledger" not in started and "ledger_budgets" not in started


@pytest.mark.parametrize("how", ["policy", "gate", "gate-object", "env"])
def test_a_local_ledger_said_to_be_meant_starts_and_is_stated_in_the_audit_log(
        how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ledger: local` in the policy, Gate(ledger="local"), a MemoryLedger handed over or PROCTOR_LEDGER=local:
    the gate starts, and every run_started record says which budgets this process counts alone."""
    policy = _policy("global", ledger="local") if how == "policy" else _policy("global")
    kwargs: dict[str, Any] = {}
    if how == "gate":
        kwargs["ledger"] = "local"
    elif how == "gate-object":
        kwargs["ledger"] = MemoryLedger()
    elif how == "env":
        monkeypatch.setenv("PROCTOR_LEDGER", "local")
    audit = InMemoryAudit()
    gate = Gate(policy, tools=[page], audit=audit, **kwargs)
    ctx = gate.start_run(principal="alice")
    gate.finish_run(ctx)
    (started,) = audit.of_kind("run_started")
    assert started["ledger"] == "local"
    assert started["ledger_budgets"] == {"pages": "global, window 3600s"}
    summary = gate.ledger_scope.summary
    assert summary is not None and summary.startswith("local: this process only")
    assert "pages (per global, window 3600s)" in summary


def test_the_audit_field_is_in_the_signed_chain_and_verifies(tmp_path: Path) -> None:
    """The statement is part of the hash chain a real AuditLog writes: `audit verify` still passes."""
    from proctor.audit import verify

    path = tmp_path / "audit.jsonl"
    with AuditLog(path) as audit:
        gate = Gate(_policy("principal", ledger="local"), tools=[page], audit=audit)
        ctx = gate.start_run(principal="alice")
        assert gate.call("page", {"who": "oncall"}, context=ctx) == "paged oncall"
        gate.finish_run(ctx)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    started = next(r for r in records if r["kind"] == "run_started")
    assert started["ledger"] == "local" and started["ledger_budgets"] == {"pages": "principal, window 3600s"}
    assert verify(path).ok


def test_the_agent_refuses_and_its_summary_states_a_local_ledger() -> None:
    """An agent is refused at construction as its gate is; with `ledger: local` its summary has a ledger row."""
    with pytest.raises(ConfigurationError, match="PROCTOR_LEDGER=redis://"):
        CodeAgent([page], ScriptedModel(["final_answer('x')"]), _policy("global"), sandbox="process")
    program = "Thought: done.\n```python\nfinal_answer(page('oncall'))\n```"
    with CodeAgent([page], ScriptedModel([program]), _policy("global", ledger="local"), sandbox="process") as agent:
        result = agent.run("page the on-call")
    assert result.status == "done"
    assert result.ledger is not None and "pages (per global, window 3600s)" in result.ledger
    assert result.as_dict()["ledger"] == result.ledger


def test_ledger_scope_is_a_public_check() -> None:
    """`proctor.ledger.ledger_scope`: what Gate.__init__ calls, usable on a policy model by itself."""
    scope = ledger_scope(_policy("global", ledger="local").model, MemoryLedger(), None)
    assert scope.local
    assert scope.audit_fields == {"ledger": "local", "ledger_budgets": {"pages": "global, window 3600s"}}
    with pytest.raises(ConfigurationError):
        ledger_scope(_policy("global").model, MemoryLedger(), "")


def test_an_unknown_ledger_mode_is_a_located_load_error() -> None:
    """`ledger: lcoal` is refused at load with its line and column, as every other key."""
    with pytest.raises(PolicyError, match=r"2:9: unknown ledger 'lcoal' \(expected one of shared, local\)"):
        Policy.from_string("version: 1\nledger: lcoal\n")


def test_policy_check_says_what_a_local_ledger_means(tmp_path: Path) -> None:
    """`proctor policy check` notes that cross-run budgets need a shared ledger, or that the policy chose local."""
    text = "version: 1\nbudgets:\n  - {name: g, per: global, limit: {calls: 3}}\n"
    shared, local = tmp_path / "shared.yaml", tmp_path / "local.yaml"
    shared.write_text(text)
    local.write_text("ledger: local\n" + text)
    out = [subprocess.run([sys.executable, "-m", "proctor.cli", "policy", "check", str(p)], capture_output=True,
                          text=True, timeout=60) for p in (shared, local)]
    assert out[0].returncode == 0 and "a gate refuses to start without a shared ledger" in out[0].stdout
    assert "--ledger redis://" in out[0].stdout
    assert out[1].returncode == 0 and "`ledger: local`" in out[1].stdout and "each process on its own" in out[1].stdout
