"""The store checked against the audit trail's order (proctor.store.trail), rule by rule, on records as the gate
writes them. The end-to-end cases (real runs, real stores, rows edited) are in the store conformance suite."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from proctor.store import JournalEntry, RunRecord, RunStore
from proctor.store.seal import StoreSeal
from proctor.store.trail import behind_trail, check_store, journal_place, trails

RUN = "run_abc"


def _intent(step: int, seq: int, **extra: Any) -> dict[str, Any]:
    return {"kind": "call_intent", "run_id": RUN, "call_id": f"call_abc_{step}_{seq}", "tool": "send", "seq": 10 + seq,
            **extra}


def _entry(seq: int, state: str) -> JournalEntry:
    return JournalEntry(RUN, 1, seq, f"call_abc_1_{seq}", "send", "d", state)  # type: ignore[arg-type]


def test_journal_place_reads_only_the_runs_own_call_ids() -> None:
    """(step, seq) of the journal's call ids; None for another run's, a managed agent's or a malformed one."""
    assert journal_place(RUN, "call_abc_3_17") == (3, 17)
    assert journal_place(RUN, "call_abd_3_17") is None
    assert journal_place(RUN, "call_abc_3") is None
    assert journal_place(RUN, "call_abc_x_1") is None


def test_a_started_call_journaled_as_waiting_or_missing_is_behind() -> None:
    """A live intent in the trail for an entry the store has as suspended, or not at all: behind."""
    trail = trails([_intent(1, 0), _intent(1, 1), _intent(1, 2)])[RUN]
    record = RunRecord(RUN, "t", status="suspended", step=1)
    journals = {1: [_entry(0, "done"), _entry(1, "suspended")]}
    found = behind_trail(record, journals, trail)
    assert [d.entry for d in found] == ["step 1, journal entry 1 (send)", "step 1, journal entry 2 (send)"]
    assert "journaled as suspended" in found[0].message and "missing" in found[1].message


def test_a_refused_intent_or_a_managed_agents_call_is_not_a_start() -> None:
    """Intents carrying a refusal (the suspension's own) and a managed agent's calls say nothing of the journal."""
    trail = trails([_intent(1, 0, error="waiting for approval"), _intent(1, 1, parent_call_id="call_abc_1_0")])[RUN]
    journals = {1: [_entry(0, "suspended")]}
    assert behind_trail(RunRecord(RUN, "t", status="suspended", step=1), journals, trail) == []


def test_a_call_started_in_a_later_step_than_the_saved_run_is_behind() -> None:
    """The run set back to an earlier step: the trail has calls of step 2 started."""
    trail = trails([_intent(1, 0), _intent(2, 0)])[RUN]
    [found] = behind_trail(RunRecord(RUN, "t", status="running", step=1), {1: [_entry(0, "done")]}, trail)
    assert found.entry == "step 2, journal entry 0 (send)" and "at step 1" in found.message


def test_a_finished_run_made_resumable_is_behind_but_an_interrupted_one_is_not() -> None:
    """run_finished done, the store says suspended: behind. Interrupted (Ctrl-C) runs are resumed as they are."""
    for status, expected in (("done", 1), ("interrupted", 0)):
        trail = trails([{"kind": "run_finished", "run_id": RUN, "status": status, "seq": 5}])[RUN]
        found = behind_trail(RunRecord(RUN, "t", status="suspended", step=1), {1: []}, trail)
        assert len(found) == expected
        assert all("records it finished (done, seq 5)" in d.message for d in found)


def test_a_store_ahead_of_the_trail_is_not_behind() -> None:
    """A process that died between its journal intent and its audit intent leaves the store ahead: not refused."""
    trail = trails([_intent(1, 0)])[RUN]
    journals = {1: [_entry(0, "done"), _entry(1, "intent")]}
    assert behind_trail(RunRecord(RUN, "t", status="running", step=1), journals, trail) == []
    assert behind_trail(RunRecord(RUN, "t", status="running", step=1), journals, None) == []


def _outcome(step: int, seq: int, status: str = "ok", **extra: Any) -> dict[str, Any]:
    return {"kind": "call_outcome", "run_id": RUN, "call_id": f"call_abc_{step}_{seq}", "tool": "send",
            "status": status, "seq": 20 + seq, **extra}


def test_a_done_entry_put_back_to_its_intent_after_the_log_said_journaled_is_behind() -> None:
    """The log's outcome says the store had the call done (`journaled`); the store has its intent: put back."""
    trail = trails([_intent(1, 0), _outcome(1, 0, journaled=True), _intent(1, 1), _outcome(1, 1, journaled=True)])[RUN]
    journals = {1: [_entry(0, "intent"), _entry(1, "done")]}
    [found] = behind_trail(RunRecord(RUN, "t", status="running", step=1), journals, trail)
    assert found.entry == "step 1, journal entry 0 (send)"
    assert "journaled as intent" in found.message and "ended ok after the store had it done (seq 20)" in found.message


def test_an_outcome_that_does_not_say_journaled_is_a_crash_not_a_rollback() -> None:
    """Intent in the store, an outcome in the log written without the journal's done behind it (a read, a failed
    store write, a call cut off, the log's reopening): the resume goes on (the call's outcome is unknown)."""
    records = [_intent(1, 0), _outcome(1, 0), _intent(1, 1), _outcome(1, 1, "unknown", intent_seq=11),
               _intent(1, 2), _outcome(1, 2, journaled="yes")]
    trail = trails(records)[RUN]
    journals = {1: [_entry(0, "intent"), _entry(1, "intent"), _entry(2, "intent")]}
    assert behind_trail(RunRecord(RUN, "t", status="running", step=1), journals, trail) == []


def test_verify_counts_a_crash_between_the_journals_done_and_the_logs_outcome_as_no_disagreement(
        tmp_path: Path) -> None:
    """The journal's done is written first: a writer that stopped before the log's outcome leaves a done the log
    never saw end (or saw closed `unknown` by its reopening). Not a disagreement; another status in the log is."""
    seal = StoreSeal(b"k" * 32)
    store = RunStore.open(f"sqlite:///{tmp_path}/runs.db")
    try:
        stored = store.create_run(RunRecord(RUN, "t", status="done", step=1))
        store.save_run(stored.evolve(seal=seal.seal_record(stored)))
        for seq in range(3):
            entry = JournalEntry(RUN, 1, seq, f"call_abc_1_{seq}", "send", "d", "done", "ok", ts_ns=1)
            store.journal_write(replace(entry, seal=seal.seal_entry(entry)))
        finished = {"kind": "run_finished", "run_id": RUN, "status": "done", "seq": 99}
        records = [_intent(1, 0), _intent(1, 1), _outcome(1, 1, "unknown", intent_seq=11), _intent(1, 2),
                   _outcome(1, 2, "failed"), finished]
        found, _ = check_store(store, seal, records)
    finally:
        store.close()
    assert [d.entry for d in found] == ["step 1, journal entry 2 (send)"] * 2, found
    assert "journaled as done (ok), but the audit trail has no outcome ok" in found[0].message


def test_read_trail_gives_a_file_logs_records_and_the_secret_its_seals_are_keyed_by(tmp_path: Path) -> None:
    """The secret beside the log is the one its sink derives the store's seal from; without it, the reader
    names the file to copy there."""
    import pytest

    from proctor.audit import AuditLog
    from proctor.audit.base import derive_key
    from proctor.errors import AuditError
    from proctor.store.seal import PURPOSE
    from proctor.store.trail import read_trail

    log = tmp_path / "audit.jsonl"
    with AuditLog(log) as audit:
        audit.append("run_started", {"run_id": RUN})
        key = audit.key_for(PURPOSE)
    records, secret = read_trail(str(log))
    assert records[0]["kind"] == "run_started" and records[0]["run_id"] == RUN  # then the checkpoint of close
    assert derive_key(secret, PURPOSE) == key
    (tmp_path / "audit.jsonl.redact-key").unlink()
    with pytest.raises(AuditError, match=r"audit\.jsonl\.redact-key: no such file: the store's seals are keyed"):
        read_trail(str(log))
