"""What every `RunStore` implementation must do, as a test class to subclass.

A subclass provides one fixture, ``store_url``: a URL naming a fresh, empty store
(``RunStore.open(store_url)`` must open it, any number of times, from any process).
The SQLite store runs it in test_store_sqlite.py; the PostgreSQL store subclasses it
the same way with a server its fixture starts. `StoreForgeryConformance`, subclassed the same
way, runs agents against the store and edits its rows as an insider would.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any, ClassVar

import pytest
from store_forgery import DURING, TWICE, Suspended, other, suspended

from proctor.approval import approval_binding
from proctor.errors import ApprovalConflict, ApprovalNotFound, RunNotFound, StoreConflict, StoreError, StoreForged
from proctor.store import ApprovalAnswer, JournalEntry, PendingApproval, RunRecord, RunStore
from proctor.store.seal import RECORD_UNSEALED


def _approval(run_id: str = "run_1", call_id: str = "call_1", args: dict[str, object] | None = None,
              policy: str = "p" * 64, seq: int = 0) -> PendingApproval:
    args = {"to": "x@evil.test"} if args is None else args
    return PendingApproval(id="", run_id=run_id, call_id=call_id, tool="send_email",
                           binding=approval_binding("send_email", args, call_id, policy), policy_sha256=policy,
                           side_effect="external", args=args, step=1, seq=seq, principal="alice",
                           labels={"env": "prod"}, rules=["external-mail"], reason="mail leaves the company")


class StoreConformance:
    """The RunStore contract (proctor/store/base.py), implementation by implementation."""

    @pytest.fixture
    def store(self, store_url: str) -> Iterator[RunStore]:
        s = RunStore.open(store_url)
        yield s
        s.close()

    # -- runs -------------------------------------------------------------------------------------

    def test_create_and_get_round_trip_every_field(self, store: RunStore) -> None:
        """A created run reads back with every field as written, at version 1."""
        record = RunRecord(run_id="run_a", task="pay the invoice", principal="alice", labels={"env": "prod"},
                           policy_sha256="f" * 64, agent="code_agent", step=2,
                           messages=[{"role": "user", "content": "hi"}], steps=[{"number": 1}],
                           step_state={"code": "x = 1", "seed": 7}, history=[{"tool": "t", "args": {"a": 1}}],
                           budgets={"calls": {"calls": 3}}, grants=[{"tool": "t", "args": {}}], seed=42,
                           trace_id="a" * 32, span_id="b" * 16)
        created = store.create_run(record)
        got = store.get_run("run_a")
        assert got == created
        assert got.version == 1 and got.created_at_ns > 0
        assert got.as_dict() | {"version": 0, "created_at_ns": 0, "updated_at_ns": 0} == record.as_dict()

    def test_create_twice_is_refused(self, store: RunStore) -> None:
        """A run id can be created only once."""
        store.create_run(RunRecord("run_a", "t"))
        with pytest.raises(StoreError):
            store.create_run(RunRecord("run_a", "t"))

    def test_missing_run_is_run_not_found(self, store: RunStore) -> None:
        """Reading, saving or cancelling an unknown run raises RunNotFound."""
        with pytest.raises(RunNotFound):
            store.get_run("run_nope")
        with pytest.raises(RunNotFound):
            store.save_run(RunRecord("run_nope", "t", version=1))
        with pytest.raises(RunNotFound):
            store.cancel_run("run_nope")

    def test_save_bumps_version_and_refuses_stale_writes(self, store: RunStore) -> None:
        """Saving from an old read is a StoreConflict; the newer write stands."""
        first = store.create_run(RunRecord("run_a", "t"))
        second = store.save_run(first.evolve(step=1))
        assert second.version == 2 and store.get_run("run_a").step == 1
        with pytest.raises(StoreConflict):
            store.save_run(first.evolve(step=9))
        assert store.get_run("run_a").step == 1

    def test_list_runs_filters_by_status_newest_first(self, store: RunStore) -> None:
        """list_runs orders by last update and filters by status."""
        a = store.create_run(RunRecord("run_a", "t"))
        store.create_run(RunRecord("run_b", "t"))
        time.sleep(0.002)
        store.save_run(a.evolve(status="suspended"))
        assert [r.run_id for r in store.list_runs()] == ["run_a", "run_b"]
        assert [r.run_id for r in store.list_runs(status="suspended")] == ["run_a"]
        assert [r.run_id for r in store.list_runs(status="running")] == ["run_b"]

    def test_claim_is_exclusive_until_released_or_expired(self, store: RunStore) -> None:
        """One owner holds a run at a time; a lease that runs out frees it."""
        store.create_run(RunRecord("run_a", "t"))
        assert store.claim_run("run_a", "p1", lease_s=60)
        assert store.claim_run("run_a", "p1", lease_s=60)
        assert not store.claim_run("run_a", "p2", lease_s=60)
        store.release_run("run_a", "p2")  # not the holder: no effect
        assert not store.claim_run("run_a", "p2", lease_s=60)
        store.release_run("run_a", "p1")
        assert store.claim_run("run_a", "p2", lease_s=0.05)
        time.sleep(0.1)
        assert store.claim_run("run_a", "p3", lease_s=60)

    def test_cancel_voids_pending_approvals(self, store: RunStore) -> None:
        """Cancelling a suspended run ends it and voids what it waited for; a finished run is left alone."""
        rec = store.create_run(RunRecord("run_a", "t"))
        filed = store.file_approval(_approval("run_a"))
        store.save_run(rec.evolve(status="suspended", pending=[filed.id]))
        cancelled = store.cancel_run("run_a", "not needed")
        assert cancelled.status == "cancelled" and list(cancelled.pending) == []
        assert store.get_run("run_a").status == "cancelled"
        assert store.get_approval(filed.id).status == "void"
        done = store.create_run(RunRecord("run_b", "t", status="done"))
        assert store.cancel_run("run_b").status == "done" == done.status

    # -- journal ----------------------------------------------------------------------------------

    def test_journal_in_seq_order_and_completed_in_place(self, store: RunStore) -> None:
        """Entries come back in seq order, per step; completing an intent replaces it."""
        for seq in (2, 0, 1):
            store.journal_write(JournalEntry("run_a", 1, seq, f"call_{seq}", "t", "d" * 64, args={"i": seq}))
        store.journal_write(JournalEntry("run_a", 2, 0, "call_x", "t", "d" * 64))
        store.journal_write(JournalEntry("run_b", 1, 0, "call_y", "t", "d" * 64))
        entries = store.journal("run_a", 1)
        assert [e.seq for e in entries] == [0, 1, 2] and all(e.state == "intent" for e in entries)
        assert entries[1].args == {"i": 1} and entries[1].ts_ns > 0
        done = JournalEntry("run_a", 1, 1, "call_1", "t", "d" * 64, state="done", status="ok",
                            value={"$tuple": [1, "two"]}, record={"status": "ok"}, history={"tool": "t"})
        store.journal_write(done, durable=False)
        again = store.journal("run_a", 1)
        assert len(again) == 3 and again[1].state == "done" and again[1].value == {"$tuple": [1, "two"]}
        assert store.journal("run_a", 3) == []

    def test_journal_holds_a_thousand_calls(self, store: RunStore) -> None:
        """A step's 1,000 entries are all kept and read back in order."""
        for seq in range(1000):
            store.journal_write(JournalEntry("run_a", 1, seq, f"call_{seq}", "t", str(seq), state="done",
                                             status="ok", value=seq))
        assert [e.value for e in store.journal("run_a", 1)] == list(range(1000))

    # -- approvals --------------------------------------------------------------------------------

    def test_file_get_list(self, store: RunStore) -> None:
        """A filed approval gets an id, reads back as filed and is listed as pending."""
        filed = store.file_approval(_approval())
        assert filed.id and filed.status == "pending" and filed.requested_at_ns > 0
        got = store.get_approval(filed.id)
        assert got == filed and got.args == {"to": "x@evil.test"} and list(got.rules) == ["external-mail"]
        assert [a.id for a in store.list_approvals()] == [filed.id]
        assert [a.id for a in store.list_approvals(run_id="run_other")] == []
        with pytest.raises(ApprovalNotFound):
            store.get_approval("apr_nope")

    def test_json_form_has_the_inbox_fields(self, store: RunStore) -> None:
        """as_dict carries the fields `approvals list --json` promises."""
        data = store.file_approval(_approval()).as_dict()
        for key in ("id", "run_id", "tool", "args", "binding", "principal", "rules", "reason", "requested_at"):
            assert key in data
        assert data["requested_at"].endswith("+00:00")

    def test_filing_the_same_binding_returns_the_stored_one(self, store: RunStore) -> None:
        """Re-filing the same call (a resumed run) finds the earlier request and its answer."""
        filed = store.file_approval(_approval())
        store.answer_approval(filed.id, ApprovalAnswer("approve", "bob"), binding=filed.binding)
        again = store.file_approval(_approval())
        assert again.id == filed.id and again.status == "answered" and again.answer is not None
        assert again.answer.approver == "bob" and again.answer.answered_at_ns > 0

    def test_filing_other_binding_for_the_call_voids_the_old_request(self, store: RunStore) -> None:
        """A new request for the same call id (new args or policy) voids the pending one."""
        old = store.file_approval(_approval(policy="a" * 64))
        new = store.file_approval(_approval(policy="b" * 64))
        assert new.id != old.id
        assert store.get_approval(old.id).status == "void"
        assert [a.id for a in store.list_approvals()] == [new.id]
        assert {a.id for a in store.list_approvals(status=None)} == {old.id, new.id}

    def test_answer_checks_binding_and_is_once_only(self, store: RunStore) -> None:
        """A wrong binding or a second answer is an ApprovalConflict; the first answer stands."""
        filed = store.file_approval(_approval())
        with pytest.raises(ApprovalConflict):
            store.answer_approval(filed.id, ApprovalAnswer("approve", "bob"), binding="0" * 64)
        answered = store.answer_approval(filed.id, ApprovalAnswer("edit", "bob", "fix the address",
                                                                  args={"to": "x@example.com"}),
                                         binding=filed.binding)
        assert answered.status == "answered" and answered.answer is not None
        assert answered.answer.verdict == "edit" and answered.answer.args == {"to": "x@example.com"}
        with pytest.raises(ApprovalConflict):
            store.answer_approval(filed.id, ApprovalAnswer("deny", "eve"), binding=filed.binding)
        assert store.get_approval(filed.id).answer == answered.answer
        with pytest.raises(ApprovalNotFound):
            store.answer_approval("apr_nope", ApprovalAnswer("approve", "bob"), binding=filed.binding)

    def test_answer_keeps_where_it_came_from(self, store: RunStore) -> None:
        """Every field of an answer is stored, the inbox's client address and the time included."""
        filed = store.file_approval(_approval())
        given = ApprovalAnswer("grant", "bob", "ok for today", grant={"to": "*@example.com"},
                               answered_at_ns=123, address="10.0.0.7")
        assert store.answer_approval(filed.id, given, binding=filed.binding).answer == given
        assert store.get_approval(filed.id).answer == given

    def test_an_answer_taken_back_leaves_the_approval_answerable(self, store: RunStore) -> None:
        """`reopen_approval` takes back exactly the answer held (a gate refused it): pending again, answerable;
        an answer that is no longer the one held is not taken back."""
        filed = store.file_approval(_approval())
        held = store.answer_approval(filed.id, ApprovalAnswer("approve", "bob", groups=["sre"]),
                                     binding=filed.binding).answer
        assert held is not None and held.groups == ["sre"]
        assert not store.reopen_approval(filed.id, ApprovalAnswer("approve", "mallory"))
        assert store.get_approval(filed.id).status == "answered"
        assert store.reopen_approval(filed.id, held)
        again = store.get_approval(filed.id)
        assert again.status == "pending" and again.answer is None
        assert not store.reopen_approval(filed.id, held)  # nothing answered to take back
        answered = store.answer_approval(filed.id, ApprovalAnswer("deny", "carol", "no"), binding=filed.binding)
        assert answered.answer is not None and answered.answer.approver == "carol"

    def test_void_approval_cannot_be_answered(self, store: RunStore) -> None:
        """A voided approval refuses answers."""
        filed = store.file_approval(_approval())
        store.void_approval(filed.id, "run cancelled")
        assert store.get_approval(filed.id).status == "void"
        with pytest.raises(ApprovalConflict):
            store.answer_approval(filed.id, ApprovalAnswer("approve", "bob"), binding=filed.binding)

    def test_an_approval_past_its_deadline_is_expired_and_takes_no_answer(self, store: RunStore) -> None:
        """Past `expires_at_ns` an approval reads as expired everywhere, and an answer is refused (recorded)."""
        from dataclasses import replace

        from proctor.errors import ApprovalExpired

        soon = store.file_approval(replace(_approval(), expires_at_ns=time.time_ns() + 10**12))
        late = store.file_approval(replace(_approval(call_id="call_2"), expires_at_ns=time.time_ns() - 1))
        assert store.get_approval(soon.id).status == "pending" and soon.as_dict()["expires_at"]
        assert store.get_approval(late.id).status == "expired"
        assert [a.id for a in store.list_approvals()] == [soon.id]
        assert [a.id for a in store.list_approvals(status="expired")] == [late.id]
        with pytest.raises(ApprovalExpired):
            store.answer_approval(late.id, ApprovalAnswer("approve", "bob"), binding=late.binding)
        assert store.get_approval(late.id).answer is None
        store.expire_approval(late.id)
        store.expire_approval(soon.id)  # whoever notices a deadline passed may record it
        assert {a.id for a in store.list_approvals(status="expired")} == {late.id, soon.id}

    def test_wait_returns_pending_after_timeout(self, store: RunStore) -> None:
        """Without an answer, waiting returns the approval still pending."""
        filed = store.file_approval(_approval())
        assert store.wait_for_answer(filed.id, 0).status == "pending"
        assert store.wait_for_answer(filed.id, 0.1).status == "pending"

    def test_wait_wakes_on_an_answer_from_another_connection(self, store: RunStore, store_url: str) -> None:
        """An answer given through another handle wakes a waiter well before its timeout."""
        filed = store.file_approval(_approval())
        other = RunStore.open(store_url)

        def answer() -> None:
            time.sleep(0.2)
            other.answer_approval(filed.id, ApprovalAnswer("approve", "bob"), binding=filed.binding)

        t = threading.Thread(target=answer)
        began = time.monotonic()
        t.start()
        got = store.wait_for_answer(filed.id, 60)
        waited = time.monotonic() - began
        t.join()
        other.close()
        assert got.status == "answered" and got.answer is not None and got.answer.verdict == "approve"
        assert waited < 30

    @pytest.mark.process
    def test_answer_from_another_process(self, store: RunStore, store_url: str) -> None:
        """Another process opening the same URL sees the request and its answer reaches this one."""
        filed = store.file_approval(_approval())
        code = ("import sys\nfrom proctor.store import RunStore, ApprovalAnswer\n"
                "s = RunStore.open(sys.argv[1])\na = s.list_approvals()[0]\n"
                "s.answer_approval(a.id, ApprovalAnswer('deny', 'carol', 'no'), binding=a.binding)\n")
        subprocess.run([sys.executable, "-c", code, store_url], check=True, timeout=120)
        got = store.wait_for_answer(filed.id, 30)
        assert got.status == "answered" and got.answer is not None
        assert (got.answer.verdict, got.answer.approver, got.answer.reason) == ("deny", "carol", "no")


@pytest.mark.sandbox
class StoreForgeryConformance:
    """What the store holds is not believed on its own, whatever the store: every field a resume reads,
    forged, and every entry rolled back, makes the resume refuse and run nothing (store_forgery.py).
    Subclassed as `StoreConformance` is, with the same ``store_url`` fixture."""

    @pytest.fixture
    def run(self, store_url: str, tmp_path: Path) -> Iterator[Suspended]:
        """A run suspended at its mail, two reads before it journaled, in this store."""
        for s in suspended(store_url, tmp_path):
            yield s.start()

    def test_forged_grant_in_a_journal_entry_is_refused(self, run: Suspended) -> None:
        """The red team's attack: a grant added to a replayed entry is refused, named, audited; nothing runs."""
        key, data = run.rows.all("journal")[0]
        run.rows.set("journal", key, {**data, "grant": {"tool": "send", "args": {}}})
        message = run.refused()
        assert run.run_id in message and "journal entry 0 (look)" in message
        [record] = run.refusals()
        assert record["run_id"] == run.run_id and "journal entry 0" in record["reason"]

    @pytest.mark.parametrize("name", [f.name for f in fields(JournalEntry) if f.name != "seal"])
    def test_every_journal_field_forged_is_refused(self, run: Suspended, name: str) -> None:
        """Each field of each journal entry, changed in the store, makes the resume refuse; put back, it goes on."""
        for key, data in run.rows.all("journal"):
            run.rows.set("journal", key, {**data, name: other(data.get(name))})
            assert run.run_id in run.refused()
            run.rows.set("journal", key, data)
        run.approve()
        assert run.resumed() == "done" and run.sent() == ["x@evil.test"]

    @pytest.mark.parametrize("name", [f.name for f in fields(RunRecord) if f.name not in RECORD_UNSEALED])
    def test_every_run_field_a_resume_reads_forged_is_refused(self, run: Suspended, name: str) -> None:
        """Each sealed field of the run record, changed in the store, makes the resume refuse."""
        [(key, data)] = run.rows.all("runs")
        # (a status forged to another resumable one: a finished run set back to `running` must not go on)
        forged = "running" if name == "status" else other(data.get(name))
        run.rows.set("runs", key, {**data, name: forged})
        assert "seal does not hold" in run.refused()
        run.rows.set("runs", key, data)
        run.approve()
        assert run.resumed() == "done"

    def test_a_huge_step_forged_is_refused_before_any_journal_is_read(self, run: Suspended) -> None:
        """A step of a hundred billion in the run's row: refused on the record's seal at once, not after reading
        the store once per step (a resume that never ends)."""
        [(key, data)] = run.rows.all("runs")
        run.rows.set("runs", key, {**data, "step": 10**11})
        assert "seal does not hold" in run.refused()

    def test_a_dropped_moved_or_copied_entry_is_refused(self, run: Suspended) -> None:
        """Entries deleted, the last one dropped, or one copied to another position: refused each time."""
        entries = run.store.journal(run.run_id, 1)
        assert [e.state for e in entries] == ["done", "done", "suspended"]
        run.rows.delete(run.run_id, 1)
        assert "out of place" in run.refused()
        run.rows.delete(run.run_id, 2)  # the last one dropped: the suspension sealed how many there were
        run.rows.insert(run.run_id, 1, entries[1].as_dict())
        assert "missing" in run.refused()
        run.rows.insert(run.run_id, 2, entries[0].as_dict())  # moved: entry 0's data at position 2
        assert "out of place" in run.refused()
        run.rows.set("journal", f"{run.run_id}:1:2", entries[2].as_dict())
        run.approve()
        assert run.resumed() == "done"

    def test_a_run_without_a_seal_is_refused(self, run: Suspended) -> None:
        """A run record whose seal was cleared is not believed."""
        [(key, data)] = run.rows.all("runs")
        run.rows.set("runs", key, {**data, "seal": ""})
        assert "seal does not hold" in run.refused()

    def test_another_audit_trail_cannot_vouch_for_the_store(self, run: Suspended) -> None:
        """The key is the run's audit trail's: an agent given another trail cannot resume (nor forge) the run."""
        other_trail = run.tmp / "elsewhere"
        other_trail.mkdir()
        with run.agent([], audit=other_trail / "audit.jsonl") as agent, \
                pytest.raises(StoreForged, match="seal does not hold"):
            agent.resume(run.run_id)

    @pytest.mark.parametrize("what", ["entry", "run"])
    def test_an_entry_rolled_back_within_the_step_is_refused(self, store_url: str, tmp_path: Path,
                                                             what: str) -> None:
        """A step suspends twice; after the first mail went out, its entry (or the whole run) is put back to the
        sealed version of the first suspension. Every seal holds; the audit trail's order catches it: refused,
        naming the entry, and the first mail is never sent twice. Put forward again, the run finishes."""
        for run in suspended(store_url, tmp_path):
            run.start(TWICE)
            first = {key: data for key, data in run.rows.all("journal")}
            [(run_key, first_run)] = run.rows.all("runs")
            assert first[f"{run.run_id}:1:1"]["state"] == "suspended"
            run.approve()
            with run.agent([]) as agent:
                assert agent.resume(run.run_id).status == "suspended"
            assert run.sent() == ["a@evil.test"]
            later = {key: data for key, data in run.rows.all("journal")}
            [(_, later_run)] = run.rows.all("runs")
            assert later[f"{run.run_id}:1:1"]["state"] == "done"
            run.rows.set("journal", f"{run.run_id}:1:1", first[f"{run.run_id}:1:1"])
            if what == "run":  # the whole run as it was at the first suspension (its journal had 2 entries)
                run.rows.set("runs", run_key, first_run)
                run.rows.delete(run.run_id, 2)
            run.approve()  # the second mail's approval: the resume would now find both answered
            message = run.refused()
            assert "step 1, journal entry 1 (send)" in message and "audit trail" in message, message
            assert run.sent() == ["a@evil.test"]
            assert any("journal entry 1" in r["reason"] for r in run.refusals())
            for key, data in later.items():  # put forward again: believed
                if key in dict(run.rows.all("journal")):
                    run.rows.set("journal", key, data)
                else:
                    run.rows.insert(run.run_id, int(key.rsplit(":", 1)[1]), data)
            run.rows.set("runs", run_key, later_run)
            assert run.resumed() == "done"
            assert run.sent() == ["a@evil.test", "b@evil.test"]

    def test_a_done_entry_put_back_to_its_intent_is_refused(self, store_url: str, tmp_path: Path) -> None:
        """A step suspends twice; the first mail goes out, and its entry is put back to the sealed intent written
        just before it ran (the store restored from a backup taken then). Every seal holds; the log's outcome says
        the store had the call done: refused, naming the entry, nothing runs. Put forward again, the run ends."""
        for run in suspended(store_url, tmp_path):
            run.start(TWICE)
            key = f"{run.run_id}:1:1"
            kept: dict[str, Any] = {}
            # as the mail runs: its entry is the intent
            DURING.append(lambda kept=kept, rows=run.rows: kept.update(rows.all("journal")))
            run.approve()
            with run.agent([]) as agent:
                assert agent.resume(run.run_id).status == "suspended"
            DURING.clear()
            assert run.sent() == ["a@evil.test"] and kept[key]["state"] == "intent"
            done = dict(run.rows.all("journal"))[key]
            assert done["state"] == "done"
            run.rows.set("journal", key, kept[key])
            run.approve()  # the second mail's approval
            message = run.refused()
            assert message.count("\n") == 0 and run.run_id in message, message
            assert "step 1, journal entry 1 (send): journaled as intent" in message and "audit trail" in message
            assert run.sent() == ["a@evil.test"]
            assert any("journal entry 1" in r["reason"] for r in run.refusals())
            assert "journaled as intent, but the audit trail records the call as ended ok" in run.verify(
                expect=1).stdout
            run.rows.set("journal", key, done)  # put forward again: believed, the second mail goes out
            assert run.resumed() == "done"
            assert run.sent() == ["a@evil.test", "b@evil.test"]

    def test_a_finished_run_put_back_to_suspended_is_refused(self, run: Suspended) -> None:
        """A run that finished, its rows put back to their sealed suspended versions, is not resumed again."""
        journal, [(run_key, record)] = run.rows.all("journal"), run.rows.all("runs")
        run.approve()
        assert run.resumed() == "done" and run.sent() == ["x@evil.test"]
        for key, data in journal:
            run.rows.set("journal", key, data)
        run.rows.set("runs", run_key, record)
        message = run.refused()
        assert "finished (done" in message, message
        assert run.sent() == ["x@evil.test"]

    def test_a_cancelled_run_put_back_to_suspended_is_refused(self, run: Suspended) -> None:
        """An approver said yes, then an operator cancelled the run (`proctor runs cancel --audit`): the cancel
        is in the run's audit trail, so the run's rows and its answered approval put back to their sealed
        versions do not make a resume send the mail; verify --store reports it."""
        run.approve()
        rows = {table: run.rows.all(table) for table in ("runs", "journal", "approvals")}
        done = subprocess.run([sys.executable, "-m", "proctor.cli", "runs", "cancel", run.run_id, "--store",
                               run.rows.url, "--audit", run.log, "--reason", "the report is wrong"],
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"run {run.run_id} cancelled (recorded in {run.log})"
        for table, kept in rows.items():
            for key, data in kept:
                run.rows.set(table, key, data)
                if table == "approvals":
                    run.rows.set_status("approvals", key, data["status"])
            if table == "runs":
                run.rows.set_status("runs", run.run_id, "suspended")
        [(_, kept_run)] = rows["runs"]  # and the row's version and claim, as the run left them
        run.rows._run(f"UPDATE {run.rows._table('runs')} SET version = ?, owner = NULL, lease_until_ns = 0 "
                      "WHERE run_id = ?", (kept_run["version"], run.run_id))
        message = run.refused()
        assert "finished (cancelled" in message, message
        assert run.sent() == []
        out = run.verify(expect=1).stdout
        assert "the audit trail records it finished (cancelled" in out, out

    # -- answers: believed only under the seal of an answerer (proctor.store.answerseal) ----------

    HAND_WRITTEN: ClassVar[dict[str, Any]] = {
        "verdict": "approve", "approver": "bob", "reason": "looks fine", "args": None, "grant": None,
        "answered_at_ns": 1, "address": "10.0.0.7", "method": "token", "os_user": "", "groups": [], "seal": ""}

    def test_an_answer_written_by_hand_in_a_valid_approvers_name_is_refused(self, run: Suspended) -> None:
        """"approve by bob" written into the approvals table: not believed on resume; nothing runs, the run
        suspends again, `approval_refused` names the approval and why, verify --store reports it; a real
        answer then goes through."""
        [pending] = run.store.list_approvals(run_id=run.run_id)
        run.answer_by_hand(pending.id, dict(self.HAND_WRITTEN))
        out = run.verify(expect=1).stdout
        assert f"approval {pending.id} (send): the answer approve by bob carries no seal" in out, out
        assert run.resumed() == "suspended"
        assert run.sent() == []
        [refused] = run.approval_refusals()
        assert (refused["code"], refused["approval_id"], refused["run_id"]) == ("seal", pending.id, run.run_id)
        assert refused["approver"] == "bob" and refused["decision"] == "approve"
        assert "carries no seal" in refused["reason"] and len(refused["reason"].splitlines()) == 1
        again = run.store.get_approval(pending.id)
        assert again.status == "pending" and again.answer is None  # answerable by a real approver
        run.approve()
        assert run.resumed() == "done"
        assert run.sent() == ["x@evil.test"]

    @pytest.mark.parametrize("after", ["kept", "put back"])
    def test_an_approval_shown_with_other_arguments_than_its_call_gets_no_answer_through(
            self, run: Suspended, after: str) -> None:
        """A store writer shows the approver another recipient than the call's (the approval's arguments
        edited, its binding kept); bob approves what he was shown. Whether the forged arguments are kept or
        put back after he answered, the answer does not run the call: nothing is sent, the refusal is in the
        trail, and the approval waits for an answer again."""
        [(aid, data)] = run.rows.all("approvals")
        shown = {"to": "ops@corp.test", "body": data["args"]["body"]}
        run.rows.set("approvals", aid, {**data, "args": shown})
        [pending] = run.store.list_approvals(run_id=run.run_id)
        assert pending.args == shown  # what the approver reads
        run.approve()
        if after == "put back":
            [(_, answered)] = run.rows.all("approvals")
            run.rows.set("approvals", aid, {**answered, "args": data["args"]})
        assert run.resumed() == "suspended"
        assert run.sent() == []
        [refused] = run.approval_refusals()
        assert (refused["code"], refused["approval_id"], refused["approver"]) == ("seal", aid, "bob")
        assert "argument" in refused["reason"], refused["reason"]
        if after == "kept":
            out = run.verify(expect=1).stdout
            assert f"approval {aid} (send): shows its answerers other arguments than the audit trail" in out, out

    def test_an_answer_copied_from_another_approval_is_refused(self, run: Suspended) -> None:
        """A real, sealed answer of one run's approval copied into another's: its seal names the first."""
        first = run.approve()
        assert first.answer is not None
        run.start()
        [pending] = run.store.list_approvals(run_id=run.run_id)
        run.answer_by_hand(pending.id, first.answer.as_dict())
        assert run.resumed() == "suspended" and run.sent() == []
        [refused] = run.approval_refusals()
        assert refused["approval_id"] == pending.id and "its seal does not hold" in refused["reason"]
        assert run.store.get_approval(pending.id).status == "pending"

    def test_an_approvals_deadline_moved_later_in_the_store_is_refused(self, run: Suspended) -> None:
        """The deadline moved an hour later in the approvals table, then a real answer (sealed with the deadline
        the answerer was shown): the trail recorded the first deadline when the call was asked about, so the
        resume refuses, naming the approval, runs nothing, and verify --store reports it."""
        [pending] = run.store.list_approvals(run_id=run.run_id)
        assert pending.expires_at_ns is not None
        [data] = [d for k, d in run.rows.all("approvals") if k == pending.id]
        run.rows.set("approvals", pending.id, {**data, "expires_at_ns": pending.expires_at_ns + 3600 * 10**9})
        run.approve()
        message = run.refused()
        assert message.count("\n") == 0 and f"approval {pending.id} (send)" in message, message
        assert "the deadline was moved in the store" in message
        assert run.sent() == []
        assert "the deadline was moved in the store" in run.verify(expect=1).stdout

    @pytest.mark.parametrize("answered", ["unanswered", "denied"])
    def test_an_approval_deleted_from_the_store_is_not_asked_again(self, run: Suspended, answered: str) -> None:
        """The approval the run waits for deleted from the store (after bob denied it, or before any answer): the
        resume would have asked for the call again, with a new deadline, and a denial would have been lost. The
        sealed run record names the approvals it waits for: the resume refuses, naming it, runs nothing, and
        verify --store reports it; the run can be cancelled."""
        [pending] = run.store.list_approvals(run_id=run.run_id)
        if answered == "denied":
            run.approve("deny", "not to that address")
        run.rows.drop("approvals", pending.id)
        message = run.refused()
        assert message.count("\n") == 0 and f"approval {pending.id}: the run waits for it, but the store does not " \
            "hold it: it was deleted" in message, message
        assert run.store.list_approvals(status=None, run_id=run.run_id) == []  # nothing asked again
        assert run.sent() == []
        assert f"approval {pending.id}: the run waits for it, but the store does not hold it" in \
            run.verify(expect=1).stdout
        assert run.store.cancel_run(run.run_id).status == "cancelled"

    def test_every_field_of_a_sealed_answer_changed_breaks_its_seal(self, run: Suspended) -> None:
        """Each field of a real answer (walked from `ApprovalAnswer`), changed in the store, is not believed;
        a real deny made an approve is refused on resume and the mail is not sent."""
        answered = run.approve("deny", "not to that address")
        assert answered.answer is not None and run.answers.problem(run.store.get_approval(answered.id)) is None
        genuine = answered.answer.as_dict()
        for name in (f.name for f in fields(ApprovalAnswer) if f.name != "seal"):
            run.answer_by_hand(answered.id, {**genuine, name: other(genuine[name])})
            assert run.answers.problem(run.store.get_approval(answered.id)) is not None, name
        run.answer_by_hand(answered.id, {**genuine, "verdict": "approve"})
        assert run.resumed() == "suspended" and run.sent() == []
        assert [r["code"] for r in run.approval_refusals()] == ["seal"]

    def test_an_answer_that_is_not_one_is_refused_not_a_deny(self, run: Suspended) -> None:
        """Rows no answerer writes (not an object; an object with none of the fields; a seal of other characters)
        neither approve nor deny: each is refused and taken back, and the run waits for a real answer."""
        [pending] = run.store.list_approvals(run_id=run.run_id)
        for forged in ("approve", {}, {**self.HAND_WRITTEN, "seal": "v1:ключ:00"}):
            run.answer_by_hand(pending.id, forged)
            assert run.resumed() == "suspended" and run.sent() == []
            assert run.store.get_approval(pending.id).status == "pending"
        assert [r["code"] for r in run.approval_refusals()] == ["seal", "seal", "seal"]
        run.approve()
        assert run.resumed() == "done" and run.sent() == ["x@evil.test"]

    def test_an_answer_sealed_under_another_trails_key_is_refused(self, run: Suspended, tmp_path: Path) -> None:
        """An inbox or CLI given another trail (another key) cannot answer this run: the refusal names both keys."""
        from proctor.store import AnswerSeal

        elsewhere = AnswerSeal.of_trail(str(tmp_path / "elsewhere.jsonl"), create=True)
        [pending] = run.store.list_approvals(run_id=run.run_id)
        run.store.answer_approval(pending.id, elsewhere.sealed(pending, ApprovalAnswer("approve", "bob",
                                                                                       method="token")),
                                  binding=pending.binding)
        assert run.resumed() == "suspended" and run.sent() == []
        [refused] = run.approval_refusals()
        assert f"sealed with answer key {elsewhere.key_id}, not this run's ({run.answers.key_id})" in refused["reason"]

    # -- proctor audit verify LOG --store URL -------------------------------------------------------

    def test_verify_store_agrees_with_the_log_it_was_written_beside(self, run: Suspended) -> None:
        """A suspended run (its answer not read yet) and a finished one: the store agrees with the log, exit 0."""
        run.approve()
        first = run.run_id
        assert run.resumed() == "done"
        run.start()  # a second run, cancelled in the store while it waited (the store's own write)
        run.store.cancel_run(run.run_id, "not needed")
        run.start()  # a third run, suspended
        run.approve()  # answered, not yet read by a resume: not a disagreement
        done = run.verify(expect=0)
        assert "agrees with the log: 3 run(s), 9 journal entries, 3 approval(s)" in done.stdout, done.stdout
        report = json.loads(run.verify("--json", expect=0).stdout)
        assert report["store"]["disagreements"] == [] and report["store"]["runs"] == 3
        assert first in {r.run_id for r in run.store.list_runs()}

    def test_verify_store_reports_every_disagreement(self, run: Suspended) -> None:
        """A finished run edited five ways and a suspended one rolled back: each disagreement on its own line,
        naming the run and the entry, in the text and the JSON report; exit 1."""
        suspended_journal = dict(run.rows.all("journal"))
        run.approve()
        assert run.resumed() == "done"
        done_id = run.run_id
        rows = dict(run.rows.all("journal"))
        # 1. the mail's entry put back to its suspended version (sealed, but behind the log)
        run.rows.set("journal", f"{done_id}:1:2", suspended_journal[f"{done_id}:1:2"])
        # 2. a read's result changed and given a grant (its seal breaks; no approval_resolved gave the grant)
        forged = {**rows[f"{done_id}:1:0"], "value": 99, "grant": {"tool": "send", "args": {}}}
        run.rows.set("journal", f"{done_id}:1:0", forged)
        # 3. the other read journaled as failed: the log saw it end ok
        run.rows.set("journal", f"{done_id}:1:1", {**rows[f"{done_id}:1:1"], "status": "failed"})
        # 4. the run's status: the log's run_finished says done
        [(key, record)] = [r for r in run.rows.all("runs") if r[0] == done_id]
        run.rows.set("runs", key, {**record, "status": "max_steps"})
        # 5. the answer's approver rewritten in the store
        [(apr, approval)] = run.rows.all("approvals")
        run.rows.set("approvals", apr, {**approval, "answer": {**approval["answer"], "approver": "mallory"}})
        out = run.verify(expect=1).stdout
        lines = [line.strip() for line in out.splitlines() if line.startswith("  run ")]
        mine = [line for line in lines if line.startswith(f"run {done_id}, ")]
        assert len(mine) == len(lines) >= 8, out
        text = "\n".join(lines)
        for expected in ("step 1, journal entry 2 (send): journaled as suspended, but the audit trail records the "
                         "call as started",
                         "step 1, journal entry 0 (look): its seal does not hold",
                         "step 1, journal entry 0 (look): carries a grant for send that no approval_resolved",
                         "step 1, journal entry 1 (look): journaled as done (failed), but the audit trail has no "
                         "outcome failed",
                         "run record: the saved run's seal does not hold",
                         "run record: the store has the run max_steps, but the audit trail's run_finished says done",
                         f"approval {apr} (send): answered approve by mallory in the store"):
            assert expected in text, (expected, out)
        assert "DISAGREES with the log" in out
        report = json.loads(run.verify("--json", expect=1).stdout)
        found = report["store"]["disagreements"]
        assert len(found) == len(lines) and all(d["run_id"] == done_id and d["entry"] and d["message"]
                                                for d in found)

    def test_verify_store_without_the_logs_key_is_a_usage_error(self, run: Suspended) -> None:
        """The seals' key lives beside the log; without it the store cannot be checked (exit 2, saying so)."""
        (run.tmp / "audit.jsonl.redact-key").rename(run.tmp / "key.bak")
        assert "redact-key: no such file" in run.verify(expect=2).stderr
