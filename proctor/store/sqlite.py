"""The embedded run store: one SQLite file (stdlib `sqlite3`, WAL), shared by every process on the machine.

``RunStore.open("sqlite:///var/lib/proctor/runs.db")`` or a plain path. Each table
keeps a few columns to query by and the record itself as JSON. Commits are
``synchronous=FULL``, so a journal intent is on disk before its tool runs. Several
processes may open the same file: SQLite serialises writers (a busy writer is
waited for up to `busy_timeout_s`); `wait_for_answer` polls, cheaply, by watching
``PRAGMA data_version``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import orjson

from proctor.calls import new_id
from proctor.errors import ApprovalConflict, ApprovalNotFound, RunNotFound, StoreConflict, StoreError
from proctor.store.base import (
    ApprovalAnswer,
    ApprovalState,
    JournalEntry,
    PendingApproval,
    RunRecord,
    RunState,
    RunStore,
    register_scheme,
)

__all__ = ["SQLiteRunStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    updated_at_ns INTEGER NOT NULL,
    version INTEGER NOT NULL,
    owner TEXT,
    lease_until_ns INTEGER NOT NULL DEFAULT 0,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_by_status ON runs (status, updated_at_ns);
CREATE TABLE IF NOT EXISTS journal (
    run_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (run_id, step, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS approvals (
    id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    binding TEXT NOT NULL,
    status TEXT NOT NULL,
    requested_at_ns INTEGER NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS approvals_by_status ON approvals (status, requested_at_ns);
CREATE INDEX IF NOT EXISTS approvals_by_call ON approvals (run_id, call_id);
CREATE INDEX IF NOT EXISTS approvals_by_binding ON approvals (binding);
"""

#: How often `wait_for_answer` looks for a change made by another connection.
_POLL_S = 0.05


def _loads(text: str) -> Any:
    return orjson.loads(text)


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _path_of(url: str) -> str:
    """``sqlite:///runs.db`` is relative, ``sqlite:////var/runs.db`` absolute (as SQLAlchemy spells them)."""
    if url.startswith("sqlite:"):
        if not url.startswith("sqlite:///"):
            raise StoreError(f"{url!r}: write sqlite:///relative/path.db or sqlite:////absolute/path.db")
        path = url[len("sqlite:///"):]
    else:
        path = url
    if not path or path == ":memory:":
        raise StoreError(f"{url!r}: a run store must be a file other processes can open (sqlite:///runs.db)")
    return path


class SQLiteRunStore(RunStore):
    """A `RunStore` in one SQLite file (see the module docstring)."""

    def __init__(self, url: str, *, busy_timeout_s: float = 30.0) -> None:
        self.url = url
        self.path = _path_of(url)
        parent = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(parent):
            raise StoreError(f"cannot open run store {self.path}: directory {parent} does not exist")
        self._lock = threading.RLock()
        try:
            self._db = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None,
                                       check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
            with self._tx():
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        self._db.execute(statement)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open run store {self.path}: {exc}") from exc
        self._closed = False

    def __repr__(self) -> str:
        return f"SQLiteRunStore({self.url!r})"

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once (BEGIN IMMEDIATE), committed or rolled back."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise StoreError(f"run store {self.path}: {exc}") from exc

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                return list(self._db.execute(sql, params))
            except sqlite3.Error as exc:
                raise StoreError(f"run store {self.path}: {exc}") from exc

    # -- runs -------------------------------------------------------------------------------------

    def create_run(self, record: RunRecord) -> RunRecord:
        now = time.time_ns()
        stored = record.evolve(version=1, created_at_ns=record.created_at_ns or now, updated_at_ns=now)
        with self._tx() as db:
            if db.execute("SELECT 1 FROM runs WHERE run_id = ?", (record.run_id,)).fetchone():
                raise StoreError(f"run {record.run_id} already exists in {self.path}")
            db.execute("INSERT INTO runs (run_id, status, updated_at_ns, version, data) VALUES (?, ?, ?, ?, ?)",
                       (stored.run_id, stored.status, now, 1, _dumps(stored.as_dict())))
        return stored

    def save_run(self, record: RunRecord) -> RunRecord:
        now = time.time_ns()
        with self._tx() as db:
            row = db.execute("SELECT version FROM runs WHERE run_id = ?", (record.run_id,)).fetchone()
            if row is None:
                raise RunNotFound(f"no run {record.run_id} in {self.path}")
            if row[0] != record.version:
                raise StoreConflict(f"run {record.run_id} was changed by someone else (version {row[0]}, "
                                    f"saving {record.version}): read it again")
            stored = record.evolve(version=record.version + 1, updated_at_ns=now)
            db.execute("UPDATE runs SET status = ?, updated_at_ns = ?, version = ?, data = ? WHERE run_id = ?",
                       (stored.status, now, stored.version, _dumps(stored.as_dict()), stored.run_id))
        return stored

    def get_run(self, run_id: str) -> RunRecord:
        rows = self._query("SELECT data FROM runs WHERE run_id = ?", (run_id,))
        if not rows:
            raise RunNotFound(f"no run {run_id} in {self.path} (see `proctor runs list`)")
        return RunRecord.from_dict(json.loads(rows[0][0]))

    def list_runs(self, *, status: RunState | None = None, limit: int = 100) -> list[RunRecord]:
        if status is None:
            rows = self._query("SELECT data FROM runs ORDER BY updated_at_ns DESC LIMIT ?", (limit,))
        else:
            rows = self._query("SELECT data FROM runs WHERE status = ? ORDER BY updated_at_ns DESC LIMIT ?",
                               (status, limit))
        return [RunRecord.from_dict(json.loads(r[0])) for r in rows]

    def claim_run(self, run_id: str, owner: str, lease_s: float = 60.0) -> bool:
        now = time.time_ns()
        with self._tx() as db:
            row = db.execute("SELECT owner, lease_until_ns FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if row is None:
                raise RunNotFound(f"no run {run_id} in {self.path}")
            holder, until = row
            if holder is not None and holder != owner and until > now:
                return False
            db.execute("UPDATE runs SET owner = ?, lease_until_ns = ? WHERE run_id = ?",
                       (owner, now + int(lease_s * 1e9), run_id))
            return True

    def release_run(self, run_id: str, owner: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE runs SET owner = NULL, lease_until_ns = 0 WHERE run_id = ? AND owner = ?",
                       (run_id, owner))

    def cancel_run(self, run_id: str, reason: str = "") -> RunRecord:
        now = time.time_ns()
        with self._tx() as db:
            row = db.execute("SELECT data FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if row is None:
                raise RunNotFound(f"no run {run_id} in {self.path}")
            record = RunRecord.from_dict(json.loads(row[0]))
            if record.status not in ("running", "suspended"):
                return record
            record = record.evolve(status="cancelled", error=reason or "cancelled", pending=(),
                                   version=record.version + 1, updated_at_ns=now)
            db.execute("UPDATE runs SET status = ?, updated_at_ns = ?, version = ?, data = ? WHERE run_id = ?",
                       (record.status, now, record.version, _dumps(record.as_dict()), run_id))
            for (aid, data) in db.execute("SELECT id, data FROM approvals WHERE run_id = ? AND status = 'pending'",
                                          (run_id,)).fetchall():
                self._set_approval(db, aid, json.loads(data), "void", None)
        return record

    # -- journal ----------------------------------------------------------------------------------

    def journal_write(self, entry: JournalEntry, *, durable: bool = True) -> None:
        data = entry.as_dict()
        if not data["ts_ns"]:
            data["ts_ns"] = time.time_ns()
        with self._lock:
            if not durable:  # WAL with synchronous=NORMAL: in the log at once, fsynced at the next checkpoint
                self._db.execute("PRAGMA synchronous=NORMAL")
            try:
                with self._tx() as db:
                    db.execute("INSERT OR REPLACE INTO journal (run_id, step, seq, data) VALUES (?, ?, ?, ?)",
                               (entry.run_id, entry.step, entry.seq, _dumps(data)))
            finally:
                if not durable:
                    self._db.execute("PRAGMA synchronous=FULL")

    def journal(self, run_id: str, step: int) -> list[JournalEntry]:
        rows = self._query("SELECT data FROM journal WHERE run_id = ? AND step = ? ORDER BY seq", (run_id, step))
        return [JournalEntry.from_dict(_loads(r[0])) for r in rows]

    # -- approvals --------------------------------------------------------------------------------

    def file_approval(self, approval: PendingApproval) -> PendingApproval:
        with self._tx() as db:
            for (data,) in db.execute("SELECT data FROM approvals WHERE binding = ? AND status != 'void' "
                                      "ORDER BY requested_at_ns DESC", (approval.binding,)).fetchall():
                return PendingApproval.from_dict(json.loads(data))
            for (aid, data) in db.execute(
                "SELECT id, data FROM approvals WHERE run_id = ? AND call_id = ? AND status = 'pending'",
                (approval.run_id, approval.call_id),
            ).fetchall():
                self._set_approval(db, aid, json.loads(data), "void", None)
            stored = PendingApproval.from_dict({
                **approval.as_dict(), "id": approval.id or new_id("apr_"), "status": "pending", "answer": None,
                "requested_at_ns": approval.requested_at_ns or time.time_ns(),
            })
            db.execute("INSERT INTO approvals (id, run_id, call_id, binding, status, requested_at_ns, data) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (stored.id, stored.run_id, stored.call_id, stored.binding, stored.status,
                        stored.requested_at_ns, _dumps(_approval_data(stored))))
        return stored

    def get_approval(self, approval_id: str) -> PendingApproval:
        rows = self._query("SELECT data FROM approvals WHERE id = ?", (approval_id,))
        if not rows:
            raise ApprovalNotFound(f"no approval {approval_id} in {self.path} (see `proctor approvals list`)")
        return PendingApproval.from_dict(json.loads(rows[0][0]))

    def list_approvals(self, *, status: ApprovalState | None = "pending", run_id: str | None = None
                       ) -> list[PendingApproval]:
        sql, params = "SELECT data FROM approvals WHERE 1 = 1", list[str]()
        if status is not None:
            sql += " AND status = ?"
            params.append(status)
        if run_id is not None:
            sql += " AND run_id = ?"
            params.append(run_id)
        rows = self._query(sql + " ORDER BY requested_at_ns DESC, id", tuple(params))
        return [PendingApproval.from_dict(json.loads(r[0])) for r in rows]

    def answer_approval(self, approval_id: str, answer: ApprovalAnswer, *, binding: str) -> PendingApproval:
        with self._tx() as db:
            row = db.execute("SELECT data FROM approvals WHERE id = ?", (approval_id,)).fetchone()
            if row is None:
                raise ApprovalNotFound(f"no approval {approval_id} in {self.path}")
            data = json.loads(row[0])
            current = PendingApproval.from_dict(data)
            if binding != current.binding:
                raise ApprovalConflict(f"approval {approval_id}: the answer is bound to another call, other "
                                       "arguments or another policy; look at it again and answer the current one")
            if current.status != "pending":
                raise ApprovalConflict(f"approval {approval_id} is already {current.status}; nothing to answer")
            stamped = replace(answer, answered_at_ns=answer.answered_at_ns or time.time_ns())
            return self._set_approval(db, approval_id, data, "answered", stamped)

    def void_approval(self, approval_id: str, reason: str = "") -> None:
        with self._tx() as db:
            row = db.execute("SELECT data FROM approvals WHERE id = ? AND status = 'pending'",
                             (approval_id,)).fetchone()
            if row is not None:
                self._set_approval(db, approval_id, json.loads(row[0]), "void", None)

    def wait_for_answer(self, approval_id: str, timeout_s: float) -> PendingApproval:
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            current = self.get_approval(approval_id)
            left = deadline - time.monotonic()
            if current.status != "pending" or left <= 0:
                return current
            time.sleep(min(_POLL_S, left))

    @staticmethod
    def _set_approval(db: sqlite3.Connection, approval_id: str, data: dict[str, Any], status: str,
                      answer: ApprovalAnswer | None) -> PendingApproval:
        data = {**data, "status": status, "answer": answer.as_dict() if answer else data.get("answer")}
        db.execute("UPDATE approvals SET status = ?, data = ? WHERE id = ?", (status, _dumps(data), approval_id))
        return PendingApproval.from_dict(data)

    # -- lifecycle --------------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()


def _approval_data(approval: PendingApproval) -> dict[str, Any]:
    data = approval.as_dict()
    data.pop("requested_at", None)
    return data


register_scheme("sqlite", SQLiteRunStore)
