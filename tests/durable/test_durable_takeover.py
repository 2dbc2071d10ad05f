"""Two processes on one run: the one whose claim ran out stops writing, and nothing runs twice.

A run's process holds it by a lease in the store (`proctor.agent.durable`), renewed while it works on the run.
A process that cannot renew it for a whole lease (cut off from the store: here its renewals are made to do
nothing) lets another process take the run over, as after a crash. The first process may still be alive:
when its call returns, its program goes on — and must not run the calls the second one runs, nor write over
what the second one saved. A process that can renew keeps the run, however long its call. Both agents live
in this process (two threads), as two processes of a fleet would, on one SQLite store and one trail (an
`InMemoryAudit`, as a PostgreSQL log takes writers from many processes); the lease is made short for the test.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import proctor.agent.durable as durable_module
from proctor import CodeAgent, InboxApprover, Policy, RunStore, ScriptedModel, tool
from proctor.agent.result import RunResult
from proctor.audit.base import AuditSink
from proctor.testing import InMemoryAudit

pytestmark = pytest.mark.sandbox

SENT: list[str] = []
#: Set while the first `send('slow', …)` is inside its tool; the test lets it return with RELEASE.
INSIDE = threading.Event()
RELEASE = threading.Event()


@tool(side_effect="external")
def send(to: str, body: str) -> str:
    """Send a message.

    Args:
        to: Recipient.
        body: Text.
    """
    SENT.append(to)
    if to == "slow" and not RELEASE.is_set():
        INSIDE.set()
        assert RELEASE.wait(120), "the test never let the slow send return"
    return f"sent {body} to {to}"


POLICY = {"version": 1, "default": "deny", "rules": [{"name": "mail", "match": {"tool": "send"}, "decision": "allow"}]}
#: A slow send (outlasting the lease), then another one that must happen once.
PROGRAM = "```py\nsend('slow', '1')\nfinal_answer(send('once', '2'))\n```"


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunStore]:
    monkeypatch.setattr(durable_module, "LEASE_S", 0.5)
    SENT.clear()
    INSIDE.clear()
    RELEASE.clear()
    s = RunStore.open(f"sqlite:///{tmp_path}/runs.db")
    yield s
    s.close()


@pytest.fixture
def cut_off(store: RunStore, monkeypatch: pytest.MonkeyPatch) -> RunStore:
    """The store, with every claim renewal lost on the way (a process that cannot reach it)."""
    monkeypatch.setattr(durable_module.ClaimKeeper, "renew", lambda self: True)
    return store


def _agent(store: RunStore, audit: AuditSink, responses: list[str]) -> CodeAgent:
    return CodeAgent([send], ScriptedModel(responses), Policy.from_dict(POLICY), approver=InboxApprover(store),
                     audit=audit, store=store, sandbox="process")


def _taken_over(store: RunStore, audit: AuditSink) -> tuple[str, RunResult]:
    """A run taken over while its first process is inside its slow send: the run's id and the first one's result."""
    first: list[RunResult] = []
    with _agent(store, audit, [PROGRAM, "```py\nfinal_answer('first')\n```"]) as agent:
        thread = threading.Thread(target=lambda: first.append(agent.run("mail twice", principal="alice")))
        thread.start()
        try:
            assert INSIDE.wait(120), "the first run never reached its slow send"
            [record] = store.list_runs()
            time.sleep(0.8)  # the first process's lease runs out while its call is still running
            # The second process takes the run over: the slow send's outcome is unknown (never run again),
            # and its model's next program sends the other mail.
            with _agent(store, audit, ["```py\nfinal_answer(send('once', '2'))\n```"]) as second:
                taken = second.resume(record.run_id)
            assert taken.status == "done", taken.error
            assert store.get_run(record.run_id).status == "done"
        finally:
            RELEASE.set()
            thread.join(120)
    [result] = first
    return record.run_id, result


def test_a_process_whose_claim_was_taken_over_runs_nothing_more_and_overwrites_nothing(cut_off: RunStore) -> None:
    store = cut_off
    audit = InMemoryAudit()
    run_id, result = _taken_over(store, audit)
    assert SENT == ["slow", "once"], SENT  # the first process's program went on, and sent nothing more
    assert store.get_run(run_id).status == "done"  # what the second one saved still stands
    assert result.status == "interrupted" and "no longer holds it" in (result.error or ""), result.error
    refused = [c for step in result.steps for c in step.tool_calls if c.tool == "send" and c.args["to"] == "once"]
    assert refused and all(c.status != "ok" for c in refused), refused
    assert any("no longer holds" in (c.error or "") for c in refused), refused
    # The trail tells both processes' stories: the run ended done in the second; the first stopped working on it
    # (interrupted, not an ending of the run: the store's done is what the trail says of the run).
    from proctor.store.seal import PURPOSE, StoreSeal
    from proctor.store.trail import check_store

    endings = [(r["status"], r.get("error"), r.get("taken_over")) for r in audit.records if r["kind"] == "run_finished"]
    assert [(status, taken) for status, _, taken in endings] == [("done", None), ("interrupted", True)], endings
    assert "no longer holds it" in str(endings[-1][1]), endings
    problems, _ = check_store(store, StoreSeal(audit.key_for(PURPOSE)), audit.records)
    # Nothing of it is the store disagreeing with the log; the takeover is said to be one: the slow send's ending
    # in the first process (it did take effect) beside the journal's unknown, and the first process's stop.
    assert [p.line() for p in problems if not p.takeover] == []
    takeovers = [(p.entry, p.message) for p in problems if p.takeover]
    assert [entry for entry, _ in takeovers] == ["step 1, journal entry 0 (send)", "run record"], takeovers
    assert "ended ok" in takeovers[0][1] and "the journal keeps failed" in takeovers[0][1], takeovers
    # The refused call of the first process is not reported: its intent says the store could not record it.
    refused_intents = [r for r in audit.records if r["kind"] == "call_intent" and r.get("refused_at") == "journal"]
    assert [r["args"]["to"] for r in refused_intents] == ["once"]


def test_audit_verify_store_reports_a_takeover_as_one_and_still_fails_on_tampering(
        cut_off: RunStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`proctor audit verify LOG --store URL` after a takeover: the store agrees with the log (exit 0), and the
    takeover is listed as such; a journal entry deleted afterwards is still a disagreement (exit 1)."""
    import json
    import sqlite3

    from proctor.audit import AuditLog
    from proctor.cli import main

    log = tmp_path / "audit.jsonl"
    audit = AuditLog(log)
    try:
        run_id, _ = _taken_over(cut_off, audit)
    finally:
        audit.close()
    url = f"sqlite:///{tmp_path}/runs.db"
    assert main(["audit", "verify", str(log), "--store", url, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["store"]
    assert report["disagreements"] == []
    assert [(d["entry"], d["takeover"]) for d in report["takeovers"]] == [
        ("step 1, journal entry 0 (send)", True), ("run record", True)]
    assert main(["audit", "verify", str(log), "--store", url]) == 0
    text = capsys.readouterr().out
    assert "agrees with the log" in text and "runs taken over by another process (not tampering)" in text
    assert "DISAGREES" not in text
    # Tampering after the takeover is still found: the second process's call dropped from the journal.
    with sqlite3.connect(tmp_path / "runs.db") as db:
        (table,) = db.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE '%journal'"
                              ).fetchone()
        assert db.execute(f"DELETE FROM {table} WHERE run_id = ? AND step = 2", (run_id,)).rowcount == 1
    assert main(["audit", "verify", str(log), "--store", url, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)["store"]
    assert any("missing" in d["message"] for d in report["disagreements"]), report
    assert len(report["takeovers"]) == 2


def test_a_process_that_renews_its_claim_keeps_the_run_through_a_call_longer_than_the_lease(store: RunStore) -> None:
    """The slow send outlasts several leases; its process renews the claim meanwhile, so another process's resume
    is refused (the run is being worked on) and the first run finishes, each mail sent once."""
    from proctor.agent.durable import DurableRun
    from proctor.errors import StoreConflict

    audit = InMemoryAudit()
    first: list[RunResult] = []
    with _agent(store, audit, [PROGRAM]) as agent:
        thread = threading.Thread(target=lambda: first.append(agent.run("mail twice", principal="alice")))
        thread.start()
        try:
            assert INSIDE.wait(120), "the first run never reached its slow send"
            [record] = store.list_runs()
            time.sleep(1.5)  # three leases
            with pytest.raises(StoreConflict, match="being worked on"):
                DurableRun.claim(store, record.run_id, set(), None)
        finally:
            RELEASE.set()
            thread.join(120)
    assert first[0].status == "done" and SENT == ["slow", "once"]


def test_a_takeover_the_store_alone_claims_is_a_disagreement_not_a_takeover(
        store: RunStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Someone who can write the store names another owner of a run while its process works on it (the owner and
    version are not sealed: claims and saves change them). The process stops as if taken over, and its trail says
    so — but no process resumed the run: the log holds no `run_resumed` after this process opened it. `proctor audit
    verify --store` reports that as a disagreement (exit 1), not as a takeover that is 'not tampering'."""
    import json

    from proctor.audit import AuditLog
    from proctor.cli import main

    url = f"sqlite:///{tmp_path}/runs.db"

    @tool(side_effect="external")
    def meddle(note: str) -> str:
        """Change the run's owner in the store, as a writer of the store could.

        Args:
            note: Anything.
        """
        other = RunStore.open(url)
        try:
            [record] = other.list_runs()
            other.save_run(record.evolve(owner="mallory:1:forged"))
        finally:
            other.close()
        return note

    log = tmp_path / "audit.jsonl"
    audit = AuditLog(log)
    policy = Policy.from_dict({**POLICY, "rules": [{"name": "all", "match": {"tool": "*"}, "decision": "allow"}]})
    try:
        with CodeAgent([send, meddle], ScriptedModel(["```py\nmeddle('x')\n```", "```py\nfinal_answer('done')\n```"]),
                       policy, approver=InboxApprover(store), audit=audit, store=store, sandbox="process") as agent:
            result = agent.run("meddle", principal="alice")
    finally:
        audit.close()
    assert result.status == "interrupted" and "no longer holds it" in (result.error or ""), result.error
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r.get("taken_over") for r in records if r["kind"] == "run_finished"] == [True]
    assert not [r for r in records if r["kind"] == "run_resumed"]
    assert main(["audit", "verify", str(log), "--store", url, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)["store"]
    assert report["takeovers"] == [], report
    [found] = report["disagreements"]
    assert found["entry"] == "run record" and "no process resumed" in found["message"], found
