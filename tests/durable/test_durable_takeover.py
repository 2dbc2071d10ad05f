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


def _agent(store: RunStore, audit: InMemoryAudit, responses: list[str]) -> CodeAgent:
    return CodeAgent([send], ScriptedModel(responses), Policy.from_dict(POLICY), approver=InboxApprover(store),
                     audit=audit, store=store, sandbox="process")


def test_a_process_whose_claim_was_taken_over_runs_nothing_more_and_overwrites_nothing(cut_off: RunStore) -> None:
    store = cut_off
    audit = InMemoryAudit()
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
    assert SENT == ["slow", "once"], SENT  # the first process's program went on, and sent nothing more
    assert store.get_run(record.run_id).status == "done"  # what the second one saved still stands
    [result] = first
    assert result.status == "interrupted" and "no longer holds it" in (result.error or ""), result.error
    refused = [c for step in result.steps for c in step.tool_calls if c.tool == "send" and c.args["to"] == "once"]
    assert refused and all(c.status != "ok" for c in refused), refused
    assert any("no longer holds" in (c.error or "") for c in refused), refused
    # The trail tells both processes' stories: the run ended done in the second; the first stopped working on it
    # (interrupted, not an ending of the run: the store's done is what the trail says of the run).
    from proctor.store.seal import PURPOSE, StoreSeal
    from proctor.store.trail import check_store

    endings = [(r["status"], r.get("error")) for r in audit.records if r["kind"] == "run_finished"]
    assert [status for status, _ in endings] == ["done", "interrupted"], endings
    assert "no longer holds it" in str(endings[-1][1]), endings
    problems, _ = check_store(store, StoreSeal(audit.key_for(PURPOSE)), audit.records)
    assert [p.line() for p in problems if p.entry == "run record"] == []


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
