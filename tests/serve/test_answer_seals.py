"""Answers are believed only under an answerer's seal, for a gate waiting in its process too.

A real gate waits on a real SQLite store (`InboxApprover(wait=…)`); an insider writes "approve by bob" straight
into the approvals table, then a real approver answers through the real inbox over HTTP (uvicorn on localhost)
or through the store CLI's own function. The durable-resume cases, on SQLite and PostgreSQL, are in
tests/store/store_conformance.py (`StoreForgeryConformance`).
"""

from __future__ import annotations

import json
import sqlite3
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from proctor import Gate, InboxApprover, Policy, RunStore
from proctor.approval.answers import answer
from proctor.approval.tokens import TokenFile
from proctor.errors import ApprovalDenied
from proctor.serve.app import create_app
from proctor.store import AnswerSeal, ApprovalAnswer, PendingApproval
from proctor.store.answerseal import PURPOSE
from proctor.testing import InMemoryAudit

from .browser import serving
from .inbox_helpers import POLICY, SENT, Inbox, background, send

ARGS = {"to": "carol@partner.org", "body": "your invoice"}
HAND_WRITTEN = {"verdict": "approve", "approver": "bob", "reason": "fine", "args": None, "grant": None,
                "answered_at_ns": 1, "address": "10.0.0.7", "method": "token", "os_user": "", "groups": [], "seal": ""}


def _gate(store: RunStore, audit: InMemoryAudit | None, wait: str = "60s") -> Gate:
    policy = Policy.from_dict({**POLICY, "approval": {**POLICY["approval"], "timeout": "2m"}})
    return Gate(policy, approver=InboxApprover(store, wait=wait), audit=audit, tools=[send])


def _first_pending(store: RunStore) -> PendingApproval:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = store.list_approvals()
        if found:
            return found[0]
        time.sleep(0.02)
    raise AssertionError("no approval was filed")


def _by_hand(db: Path, approval_id: str, answer: dict[str, Any]) -> None:
    """What an insider with write access to the SQLite file does: the row set answered, with `answer`."""
    with sqlite3.connect(db) as con:
        (data,) = con.execute("SELECT data FROM approvals WHERE id = ?", (approval_id,)).fetchone()
        row = {**json.loads(data), "status": "answered", "answer": answer}
        con.execute("UPDATE approvals SET status = 'answered', data = ? WHERE id = ?", (json.dumps(row), approval_id))


def _until(check: Any, what: str) -> None:
    deadline = time.monotonic() + 60
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_a_waiting_gate_refuses_a_hand_written_answer_and_takes_the_real_one(inbox: Inbox) -> None:
    """"approve by bob" written into the store while the gate waits: refused (`approval_refused`, code seal),
    taken back, the call does not run on it; bob's real answer through the CLI's path then runs it once."""
    store = RunStore.open(inbox.store_url)
    audit = InMemoryAudit()
    try:
        gate = _gate(store, audit)
        ctx = gate.start_run(principal="alice")
        waiting, out = background(lambda: gate.call("send", dict(ARGS), context=ctx, call_id="c1"))
        pending = _first_pending(store)
        _by_hand(inbox.tmp / "runs.db", pending.id, dict(HAND_WRITTEN))
        _until(lambda: audit.of_kind("approval_refused"), "the refusal")
        _until(lambda: store.get_approval(pending.id).status == "pending", "the approval to be answerable again")
        assert SENT == [] and waiting.is_alive()
        [refused] = audit.of_kind("approval_refused")
        assert (refused["code"], refused["approval_id"], refused["approver"]) == ("seal", pending.id, "bob")
        assert "carries no seal" in refused["reason"] and "\n" not in refused["reason"]
        answer(store, pending.id, approver="bob", address="cli:here", decision="approve", binding=pending.binding,
               method="os-user", os_user="bob", seal=AnswerSeal(audit.key_for(PURPOSE)))
        waiting.join(timeout=60)
        assert out == ["sent to carol@partner.org"] and SENT == [("carol@partner.org", "your invoice")]
        [resolved] = [r for r in audit.of_kind("approval_resolved")]
        assert (resolved["approver"], resolved["address"], resolved["refused"]) == ("bob", "cli:here", None)
    finally:
        store.close()


def test_a_gate_without_a_trail_believes_no_stored_answer(inbox: Inbox) -> None:
    """No audit trail, no key to check an answer with: even a sealed answer is refused, saying why."""
    store = RunStore.open(inbox.store_url)
    try:
        gate = _gate(store, None, wait="30s")
        ctx = gate.start_run(principal="alice")
        waiting, out = background(lambda: gate.call("send", dict(ARGS), context=ctx, call_id="c1"))
        pending = _first_pending(store)
        store.answer_approval(pending.id, inbox.answers.sealed(pending, ApprovalAnswer("approve", "bob")),
                              binding=pending.binding)
        waiting.join(timeout=60)
        [error] = out
        assert isinstance(error,
                          ApprovalDenied) and "the gate has no audit trail whose key proves answers" in str(error)
        assert SENT == []
    finally:
        store.close()


@pytest.mark.parametrize("forged_first", [False, True])
def test_the_inbox_over_http_answers_and_the_waiting_gate_runs_the_call(inbox: Inbox, forged_first: bool) -> None:
    """Bob approves through the real inbox (uvicorn, bearer token, JSON API): the answer is sealed with the
    runs' key, the gate believes it and runs the call. A hand-written answer before it is refused and
    taken back, and the inbox then takes bob's."""
    store = RunStore.open(inbox.store_url)
    audit = InMemoryAudit()
    try:
        seal = AnswerSeal(audit.key_for(PURPOSE))
        gate = _gate(store, audit)
        ctx = gate.start_run(principal="alice")
        with serving(create_app(store, TokenFile.load(inbox.tokens_path), answers=seal)) as url:
            waiting, out = background(lambda: gate.call("send", dict(ARGS), context=ctx, call_id="c1"))
            pending = _first_pending(store)
            if forged_first:
                _by_hand(inbox.tmp / "runs.db", pending.id, dict(HAND_WRITTEN))
                _until(lambda: audit.of_kind("approval_refused"), "the gate's refusal")
            body = json.dumps({"decision": "approve", "binding": pending.binding, "reason": "checked"}).encode()
            request = urllib.request.Request(f"{url}/api/approvals/{pending.id}", data=body, method="POST",
                                             headers={"Authorization": f"Bearer {inbox.tokens['bob']}",
                                                      "Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as response:
                assert response.status == 200
                stored = json.loads(response.read())
            assert stored["answer"]["seal"].startswith(f"v1:{seal.key_id}:")
            waiting.join(timeout=60)
        assert out == ["sent to carol@partner.org"] and SENT == [("carol@partner.org", "your invoice")]
        assert [r["code"] for r in audit.of_kind("approval_refused")] == (["seal"] if forged_first else [])
        [resolved] = audit.of_kind("approval_resolved")
        assert (resolved["approver"], resolved["method"], resolved["reason"]) == ("bob", "token", "checked")
    finally:
        store.close()


def test_the_inbox_shows_a_hand_written_answer_as_pending_and_takes_the_real_one(inbox: Inbox) -> None:
    """A suspended run's approval answered by hand in the store: the inbox does not show it answered (it refuses
    it, recorded in the runs' trail, and takes it back); bob answers over HTTP and the resumed run sends once."""
    from proctor.store.refusals import AuditTrail

    approval_id = inbox.suspend()
    _by_hand(inbox.tmp / "runs.db", approval_id, dict(HAND_WRITTEN))
    store = RunStore.open(inbox.store_url)
    trail = inbox.tmp / "audit.jsonl"
    try:
        app = create_app(store, TokenFile.load(inbox.tokens_path), answers=inbox.answers,
                         refusals=AuditTrail(str(trail)))
        with serving(app) as url:
            auth = {"Authorization": f"Bearer {inbox.tokens['bob']}"}
            with urllib.request.urlopen(urllib.request.Request(f"{url}/api/approvals", headers=auth),
                                        timeout=30) as response:
                listed = json.loads(response.read())
            assert [(a["id"], a["status"], a["answer"]) for a in listed] == [(approval_id, "pending", None)]
            refused = [r for r in map(json.loads, trail.read_text().splitlines()) if r["kind"] == "approval_refused"]
            assert [(r["code"], r["approval_id"], r["approver"]) for r in refused] == [("seal", approval_id, "bob")]
            body = json.dumps({"decision": "approve", "binding": listed[0]["binding"], "confirm": "send"}).encode()
            request = urllib.request.Request(f"{url}/api/approvals/{approval_id}", data=body, method="POST",
                                             headers={**auth, "Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as response:
                assert response.status == 200
    finally:
        store.close()
    assert inbox.resume(listed[0]["run_id"]).status == "done"
    assert SENT == [("carol@partner.org", "your invoice")]


def test_an_answer_key_file_alone_seals_the_clis_answers(inbox: Inbox, capsys: pytest.CaptureFixture[str]) -> None:
    """`proctor approvals answer-key` writes the runs' answer key (0600, never over a file); an approver's host
    given only that file (`--answer-key`) answers so that the run goes on."""
    import os
    import stat

    from proctor.cli import main

    approval_id = inbox.suspend()
    key = inbox.tmp / "answer.key"
    trail = str(inbox.tmp / "audit.jsonl")
    assert main(["approvals", "answer-key", "--audit", trail, "--out", str(key)]) == 0
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    assert AnswerSeal.from_file(key).key_id == inbox.answers.key_id and inbox.answers.key_id in capsys.readouterr().out
    assert main(["approvals", "answer-key", "--audit", trail, "--out", str(key)]) == 1
    assert "exists already" in capsys.readouterr().err
    assert main(["approvals", "approve", approval_id, "--store", inbox.store_url, "--as", "bob",
                 "--answer-key", str(key)]) == 0
    store = RunStore.open(inbox.store_url)
    try:
        run_id = store.get_approval(approval_id).run_id
    finally:
        store.close()
    assert inbox.resume(run_id).status == "done"
    assert SENT == [("carol@partner.org", "your invoice")]


def test_approvals_list_and_show_mark_an_answer_whose_seal_does_not_hold(
        inbox: Inbox, capsys: pytest.CaptureFixture[str]) -> None:
    """`proctor approvals list --all` and `show` with the runs' trail: a hand-written answer is shown as not
    believed (the gate will refuse it), a real one as answered; without a key, as not checked."""
    from proctor.cli import main

    approval_id = inbox.suspend()
    trail = str(inbox.tmp / "audit.jsonl")
    _by_hand(inbox.tmp / "runs.db", approval_id, dict(HAND_WRITTEN))
    assert main(["approvals", "show", approval_id, "--store", inbox.store_url, "--audit", trail]) == 0
    shown = capsys.readouterr().out
    assert "NOT BELIEVED" in shown and "carries no seal" in shown, shown
    assert main(["approvals", "list", "--all", "--store", inbox.store_url, "--audit", trail]) == 0
    assert "answered, NOT BELIEVED" in capsys.readouterr().out
    assert main(["approvals", "show", approval_id, "--store", inbox.store_url,
                 "--audit", str(inbox.tmp / "no-such-trail.jsonl")]) == 0
    assert "seal not checked: no audit trail at" in capsys.readouterr().out
    store = RunStore.open(inbox.store_url)
    try:
        store.reopen_approval(approval_id, store.get_approval(approval_id).answer)
        pending = store.get_approval(approval_id)
        answer(store, approval_id, approver="bob", address="127.0.0.1", decision="approve",
               binding=pending.binding, method="token", groups=(), seal=inbox.answers)
    finally:
        store.close()
    assert main(["approvals", "show", approval_id, "--store", inbox.store_url, "--audit", trail]) == 0
    shown = capsys.readouterr().out
    assert "answer    approve by bob" in shown and "NOT BELIEVED" not in shown and "seal" not in shown.split(
        "binding")[1], shown
