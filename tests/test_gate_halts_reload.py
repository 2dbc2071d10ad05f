"""The gate honours halts (after admission, naming the halt) and reloads a policy file between calls, whole."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from proctor.errors import AuditError, ToolDenied
from proctor.gate import Gate
from proctor.halt import HaltError, MemoryHalts, install_signal_halt
from proctor.policy import Policy
from proctor.policy.reload import PolicyChange, PolicyRefused, PolicySource
from proctor.testing import InMemoryAudit
from proctor.tools import tool

RAN: list[str] = []


@tool(side_effect="external")
def page(who: str) -> str:
    """Page someone.

    Args:
        who: Who.
    """
    RAN.append(who)
    return "paged"


ALLOW = {"version": 1, "rules": [{"name": "pages", "match": {"tool": "page"}, "decision": "allow"}]}
DENY = {"version": 1, "rules": [{"name": "no-pages", "match": {"tool": "page"}, "decision": "deny",
                                 "reason": "paging is off"}]}


@pytest.fixture(autouse=True)
def _clear() -> None:
    RAN.clear()


def test_a_halt_refuses_matching_calls_naming_it_and_lifting_it_lets_them_run() -> None:
    halts = MemoryHalts()
    audit = InMemoryAudit()
    gate = Gate(Policy.from_dict(ALLOW), audit=audit, tools=[page], halts=halts)
    ctx = gate.start_run(principal="alice")
    halt = halts.set(scope="tool", value="page", reason="incident 42")
    with pytest.raises(ToolDenied, match=rf"page: halted by {halt.id}: incident 42"):
        gate.call("page", {"who": "oncall"}, context=ctx)
    assert RAN == []
    intent = audit.of_kind("call_intent")[-1]
    assert intent["halt_id"] == halt.id and "incident 42" in intent["error"]
    halts.lift(halt.id)
    assert gate.call("page", {"who": "oncall"}, context=ctx) == "paged"
    bobs = halts.set(scope="principal", value="bob", reason="bob's runs")
    with pytest.raises(ToolDenied, match=f"halted by {bobs.id}"):
        gate.call("page", {"who": "x"}, context=gate.start_run(principal="bob"))
    assert gate.call("page", {"who": "y"}, context=gate.start_run(principal="carol")) == "paged"
    assert RAN == ["oncall", "y"]


def test_halting_an_agent_stops_the_calls_of_the_managed_agents_working_for_it() -> None:
    """A managed agent's calls are its parent's work (the same run, `run.agent` its own name): halting the
    parent stops them too, or an agent halted mid-delegation would go on acting through its helper."""
    halts = MemoryHalts()
    gate = Gate(Policy.from_dict(ALLOW), tools=[page], halts=halts)
    ctx = gate.start_run(principal="alice", agent="boss")
    helper = ctx.delegate("helper", ledger=ctx.ledger, tools=gate.tools, parent_call_id="call_parent")
    assert gate.call("page", {"who": "a"}, context=helper) == "paged"
    halt = halts.set(scope="agent", value="boss", reason="boss misbehaves")
    with pytest.raises(ToolDenied, match=f"halted by {halt.id}: boss misbehaves"):
        gate.call("page", {"who": "b"}, context=helper)
    with pytest.raises(ToolDenied, match=f"halted by {halt.id}"):
        gate.call("page", {"who": "c"}, context=ctx)
    halts.lift(halt.id)
    # A halt of the helper stops the helper's calls only.
    only = halts.set(scope="agent", value="helper", reason="helper misbehaves")
    with pytest.raises(ToolDenied, match=f"halted by {only.id}"):
        gate.call("page", {"who": "d"}, context=helper)
    assert gate.call("page", {"who": "e"}, context=ctx) == "paged"
    assert RAN == ["a", "e"]


def test_a_denied_call_is_denied_by_the_policy_not_the_halt() -> None:
    halts = MemoryHalts()
    gate = Gate(Policy.from_dict(DENY), tools=[page], halts=halts)
    halts.set(reason="everything stops")
    with pytest.raises(ToolDenied, match="paging is off"):
        gate.call("page", {"who": "oncall"})


def test_a_halt_set_while_a_call_waits_for_its_approval_refuses_it_when_the_answer_comes() -> None:
    """The human's answer may come minutes after the halt: the call has not started, so the halt stops it."""
    from proctor.approval.callback import CallbackApprover

    halts = MemoryHalts()
    audit = InMemoryAudit()
    set_while_asking = []

    def approve_after_a_halt(request: object) -> bool:
        set_while_asking.append(halts.set(scope="tool", value="page", reason="incident 43"))
        return True

    asks = {"version": 1, "rules": [{"name": "pages-need-a-human", "match": {"tool": "page"},
                                     "decision": "require_approval"}]}
    gate = Gate(Policy.from_dict(asks), audit=audit, tools=[page], halts=halts,
                approver=CallbackApprover(approve_after_a_halt))
    with pytest.raises(ToolDenied, match=r"page: halted by halt_\w+: incident 43"):
        gate.call("page", {"who": "oncall"})
    assert RAN == [] and len(set_while_asking) == 1
    assert audit.of_kind("call_intent")[-1]["halt_id"] == set_while_asking[0].id


def _write(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(data))
    os.replace(tmp, path)


def test_a_gate_given_a_policy_path_reloads_it_between_calls_and_records_the_change(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    _write(path, ALLOW)
    audit = InMemoryAudit()
    gate = Gate(PolicySource(path, check_every_ms=0), audit=audit, tools=[page])
    ctx = gate.start_run()
    assert gate.call("page", {"who": "a"}, context=ctx) == "paged"
    old = gate.policy.sha256
    _write(path, DENY)
    time.sleep(0.01)
    with pytest.raises(ToolDenied, match="paging is off"):
        gate.call("page", {"who": "b"}, context=ctx)
    (change,) = audit.of_kind("policy_changed")
    assert change["old_sha256"] == old and change["new_sha256"] == Policy.from_dict(DENY).sha256
    intents = audit.of_kind("call_intent")
    assert [i["policy_sha256"] for i in intents] == [old, change["new_sha256"]]
    path.write_text("version: 1\nrules: [{name: broken, match: {tool: page}, decision: alow}]\n")  # refused
    time.sleep(0.01)
    with pytest.raises(ToolDenied, match="paging is off"):  # the last good policy keeps deciding
        gate.call("page", {"who": "c"}, context=ctx)
    assert len(audit.of_kind("policy_changed")) == 1


def test_a_path_given_as_a_string_is_a_reloading_policy(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    _write(path, ALLOW)
    gate = Gate(str(path), tools=[page])
    assert gate.call("page", {"who": "a"}) == "paged"


def test_reload_new_runs_pins_a_run_to_the_policy_it_started_with(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    _write(path, {**ALLOW, "reload": "new_runs"})
    gate = Gate(PolicySource(path, check_every_ms=0), tools=[page])
    ctx = gate.start_run()
    assert gate.call("page", {"who": "a"}, context=ctx) == "paged"
    _write(path, {**DENY, "reload": "new_runs"})
    time.sleep(0.01)
    assert gate.call("page", {"who": "b"}, context=ctx) == "paged"  # pinned
    with pytest.raises(ToolDenied, match="paging is off"):
        gate.call("page", {"who": "c"}, context=gate.start_run())  # a new run gets the new policy


def test_reload_new_runs_pins_a_run_that_started_before_it_but_had_made_no_call_yet(tmp_path: Path) -> None:
    """The run started under the old policy (its run_started says so): that is the one it keeps."""
    path = tmp_path / "policy.yaml"
    _write(path, ALLOW)
    audit = InMemoryAudit()
    gate = Gate(PolicySource(path, check_every_ms=0), audit=audit, tools=[page])
    ctx = gate.start_run()
    _write(path, {**DENY, "reload": "new_runs"})
    time.sleep(0.01)
    assert gate.call("page", {"who": "a"}, context=ctx) == "paged"
    (started,) = audit.of_kind("run_started")
    assert audit.of_kind("call_intent")[-1]["policy_sha256"] == started["policy_sha256"] \
        == Policy.from_dict(ALLOW).sha256


def test_a_reload_that_adds_a_global_budget_on_a_local_ledger_starts_no_run(tmp_path: Path) -> None:
    """Issue 34: a budget's scope is never silently narrower than written, after a reload too."""
    from proctor.errors import ConfigurationError

    path = tmp_path / "policy.yaml"
    _write(path, ALLOW)
    gate = Gate(PolicySource(path, check_every_ms=0), tools=[page])
    assert gate.call("page", {"who": "a"}, context=gate.start_run()) == "paged"
    _write(path, {**ALLOW, "budgets": [{"name": "pages", "per": "global", "window": "1h", "limit": {"calls": 3}}]})
    time.sleep(0.01)
    with pytest.raises(ConfigurationError, match="PROCTOR_LEDGER=redis://"):
        gate.start_run()
    _write(path, {**ALLOW, "ledger": "local",
                  "budgets": [{"name": "pages", "per": "global", "window": "1h", "limit": {"calls": 3}}]})
    time.sleep(0.01)
    assert gate.call("page", {"who": "b"}, context=gate.start_run()) == "paged"  # said so: then it is local


def test_a_run_in_flight_takes_the_new_policys_budgets_with_its_rules(tmp_path: Path) -> None:
    """A run switches to a reloaded policy whole at its next call: its budgets too, not the rules of the new one
    over the budgets of the old. A budget both have keeps what the run used; a new one counts from the switch."""
    from proctor.errors import BudgetExceeded

    path = tmp_path / "policy.yaml"
    _write(path, {**ALLOW, "budgets": [{"name": "pages", "limit": {"calls": 3}}]})
    audit = InMemoryAudit()
    gate = Gate(PolicySource(path, check_every_ms=0), audit=audit, tools=[page])
    ctx = gate.start_run()
    assert gate.call("page", {"who": "a"}, context=ctx) == "paged"
    assert gate.call("page", {"who": "b"}, context=ctx) == "paged"
    new = {**ALLOW, "budgets": [{"name": "pages", "limit": {"calls": 2}},
                                {"name": "one-more", "limit": {"calls": 1}}]}
    _write(path, new)
    time.sleep(0.01)
    with pytest.raises(BudgetExceeded, match="budget 'pages' exhausted: 2 of 2 calls used"):
        gate.call("page", {"who": "c"}, context=ctx)
    assert audit.of_kind("call_intent")[-1]["policy_sha256"] == Policy.from_dict(new).sha256
    other = gate.start_run()
    _write(path, {**ALLOW, "budgets": [{"name": "one-more", "limit": {"calls": 1}}]})
    time.sleep(0.01)
    assert gate.call("page", {"who": "d"}, context=other) == "paged"
    with pytest.raises(BudgetExceeded, match="budget 'one-more'"):
        gate.call("page", {"who": "e"}, context=other)
    assert RAN == ["a", "b", "d"]


def test_a_run_in_flight_is_not_switched_to_a_shared_budget_on_a_local_ledger(tmp_path: Path) -> None:
    """As a new run is refused (issue 34), so is the next call of a run in flight: the new policy's global budget
    would otherwise count on a process-local ledger it did not ask for."""
    path = tmp_path / "policy.yaml"
    _write(path, ALLOW)
    gate = Gate(PolicySource(path, check_every_ms=0), tools=[page])
    ctx = gate.start_run()
    assert gate.call("page", {"who": "a"}, context=ctx) == "paged"
    _write(path, {**ALLOW, "budgets": [{"name": "pages", "per": "global", "window": "1h", "limit": {"calls": 3}}]})
    time.sleep(0.01)
    with pytest.raises(ToolDenied, match="PROCTOR_LEDGER=redis://"):
        gate.call("page", {"who": "b"}, context=ctx)
    assert RAN == ["a"]


def test_a_change_callback_that_raises_neither_fails_the_call_nor_skips_the_record(tmp_path: Path) -> None:
    """The source's own `on_change` (a user's: a metrics hook, a notifier) raising must not end the call that
    noticed the change, nor leave the new policy deciding without its `policy_changed` record."""
    path = tmp_path / "policy.yaml"
    _write(path, ALLOW)
    told: list[str] = []

    def broken_hook(change: PolicyChange) -> None:
        told.append(change.new_sha256)
        raise RuntimeError("notifier down")

    refused: list[str] = []

    def broken_refusal_hook(refusal: PolicyRefused) -> None:
        refused.append(refusal.message)
        raise RuntimeError("notifier down")

    audit = InMemoryAudit()
    source = PolicySource(path, check_every_ms=0, on_change=broken_hook, on_refused=broken_refusal_hook)
    gate = Gate(source, audit=audit, tools=[page])
    ctx = gate.start_run()
    _write(path, DENY)
    time.sleep(0.01)
    outcome = gate.submit("page", {"who": "a"}, context=ctx)  # never raises
    assert outcome.record.status == "denied" and "paging is off" in str(outcome.error)
    (change,) = audit.of_kind("policy_changed")
    assert told == [change["new_sha256"]] == [Policy.from_dict(DENY).sha256]
    path.write_text("version: 1\nrules: [{name: x, match: {tool: page}, decision: alow}]\n")
    time.sleep(0.01)
    outcome = gate.submit("page", {"who": "b"}, context=ctx)
    assert outcome.record.status == "denied" and "paging is off" in str(outcome.error) and len(refused) == 1
    assert RAN == []


def _halt_records(audit: InMemoryAudit) -> list[tuple[str, str, str | None, str | None, str]]:
    return [(r["kind"], r["halt_id"], r["by"], r["reason"], r["via"])
            for r in audit.records if r["kind"] in ("halt_set", "halt_lifted")]


def test_a_halt_set_and_lifted_through_the_gate_is_audited_with_who_and_why() -> None:
    halts = MemoryHalts()
    audit = InMemoryAudit()
    gate = Gate(Policy.from_dict(ALLOW), audit=audit, tools=[page], halts=halts)
    ctx = gate.start_run()
    halt = gate.halt("incident 42", scope="tool", value="page", by="oncall-ann")
    with pytest.raises(ToolDenied, match=f"halted by {halt.id}: incident 42"):
        gate.call("page", {"who": "x"}, context=ctx)
    gate.lift_halt(halt.id, "resolved", by="oncall-bob")
    assert gate.call("page", {"who": "y"}, context=ctx) == "paged"
    # One record each (the channel's telling of the gate's own halt is not a second one), who and why.
    assert _halt_records(audit) == [("halt_set", halt.id, "oncall-ann", "incident 42", "api"),
                                    ("halt_lifted", halt.id, "oncall-bob", "resolved", "api")]
    assert audit.of_kind("halt_lifted")[0]["halt_reason"] == "incident 42"
    with pytest.raises(HaltError, match="no active halt"):
        gate.lift_halt(halt.id, "again")
    with pytest.raises(HaltError, match="reason"):
        gate.lift_halt(halt.id, " ")


def test_a_halt_set_on_the_channel_or_by_signal_is_audited_by_every_gate_using_it() -> None:
    halts = MemoryHalts()
    first, second = InMemoryAudit(), InMemoryAudit()
    gates = [Gate(Policy.from_dict(ALLOW), audit=a, tools=[page], halts=halts) for a in (first, second)]
    halt = halts.set(scope="all", reason="freeze", by="ops-carol")
    halts.lift(halt.id, reason="thaw", by="ops-dave")
    for audit in (first, second):
        assert _halt_records(audit) == [("halt_set", halt.id, "ops-carol", "freeze", "api"),
                                        ("halt_lifted", halt.id, "ops-dave", "thaw", "api")]
    uninstall = install_signal_halt(halts)
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        deadline = time.monotonic() + 5
        while not first.of_kind("halt_set")[1:] and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        uninstall()
    signalled = first.of_kind("halt_set")[-1]
    assert signalled["via"] == "signal" and signalled["by"] == "signal SIGUSR2" and "SIGUSR2" in signalled["reason"]
    with pytest.raises(ToolDenied, match=f"halted by {signalled['halt_id']}"):
        gates[1].call("page", {"who": "x"}, context=gates[1].start_run())
    halts.lift(signalled["halt_id"], reason="signal test over")


def test_a_halt_the_gate_cannot_record_stays_in_force_and_a_lift_it_cannot_record_does_not_happen() -> None:
    halts = MemoryHalts()
    audit = InMemoryAudit(fail_on=("halt_set", "halt_lifted"))
    gate = Gate(Policy.from_dict(ALLOW), audit=audit, tools=[page], halts=halts)
    with pytest.raises(AuditError, match="IS IN FORCE"):
        gate.halt("incident 43")
    (halt,) = halts.active()
    with pytest.raises(AuditError, match="halt_lifted"):
        gate.lift_halt(halt.id, "resolved")
    assert halts.active() == (halt,)
    with pytest.raises(ToolDenied, match=f"halted by {halt.id}"):
        gate.call("page", {"who": "x"}, context=gate.start_run())
    halts.lift(halt.id)


def test_a_gate_watching_the_process_halts_is_not_kept_alive_by_them() -> None:
    import gc
    import weakref

    halts = MemoryHalts()
    gate = Gate(Policy.from_dict(ALLOW), audit=InMemoryAudit(), tools=[page], halts=halts)
    ref = weakref.ref(gate)
    del gate
    gc.collect()
    assert ref() is None
    for _ in range(50):  # gates come and go: their entries go with them
        Gate(Policy.from_dict(ALLOW), audit=InMemoryAudit(), tools=[page], halts=halts)
    gc.collect()
    assert halts.watchers == 0
    halts.lift(halts.set(reason="no gate to tell").id)  # the dead watcher is dropped, nothing fails
