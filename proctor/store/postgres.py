"""The fleet's run store: PostgreSQL through psycopg 3, shared by every worker on every host.

``RunStore.open("postgresql://user@host/db")`` — the same interface and semantics as the
SQLite store (`proctor.store.base`), with PostgreSQL's own tools for them:

- each table keeps a few columns to query by and the record itself as JSONB;
- writes are transactions with row locks (``SELECT … FOR UPDATE``); concurrent filings
  of one approval binding take an advisory lock on it, so exactly one is stored;
- commits are synchronous (``synchronous_commit=on``): a journal intent is on disk (and
  on synchronous standbys, if the server has them) before its tool runs;
- `wait_for_answer` sleeps on ``LISTEN proctor_approvals``: answering or voiding an
  approval sends ``NOTIFY proctor_approvals, '<id>'`` in the same transaction, so a
  waiting run wakes the moment the answer commits, from any process on any host.

A lost connection fails the operation in flight with `StoreError`; the next one
reconnects. Tables are created on first use (``proctor_runs``, ``proctor_journal``,
``proctor_approvals``) in the connection's schema (``options=-csearch_path=…`` picks one).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

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

__all__ = ["PostgresRunStore"]

_CHANNEL = "proctor_approvals"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS proctor_runs (
    run_id text PRIMARY KEY,
    status text NOT NULL,
    updated_at_ns bigint NOT NULL,
    version bigint NOT NULL,
    owner text,
    lease_until_ns bigint NOT NULL DEFAULT 0,
    data jsonb NOT NULL
);
CREATE INDEX IF NOT EXISTS proctor_runs_by_status ON proctor_runs (status, updated_at_ns);
CREATE TABLE IF NOT EXISTS proctor_journal (
    run_id text NOT NULL,
    step integer NOT NULL,
    seq integer NOT NULL,
    data jsonb NOT NULL,
    PRIMARY KEY (run_id, step, seq)
);
CREATE TABLE IF NOT EXISTS proctor_approvals (
    id text PRIMARY KEY,
    run_id text NOT NULL,
    call_id text NOT NULL,
    binding text NOT NULL,
    status text NOT NULL,
    requested_at_ns bigint NOT NULL,
    data jsonb NOT NULL
);
CREATE INDEX IF NOT EXISTS proctor_approvals_by_status ON proctor_approvals (status, requested_at_ns);
CREATE INDEX IF NOT EXISTS proctor_approvals_by_call ON proctor_approvals (run_id, call_id);
CREATE INDEX IF NOT EXISTS proctor_approvals_by_binding ON proctor_approvals (binding);
"""


def _shown(url: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password:
        parts = parts._replace(netloc=f"{parts.username or ''}:***@{parts.hostname or ''}"
                                      + (f":{parts.port}" if parts.port else ""))
    return urlunsplit(parts)


class PostgresRunStore(RunStore):
    """A `RunStore` in PostgreSQL (see the module docstring)."""

    def __init__(self, url: str, *, connect_timeout_s: int = 5) -> None:
        self.url = url
        self._shown = _shown(url)
        self._timeout = connect_timeout_s
        self._lock = threading.RLock()
        self._conn: psycopg.Connection[Any] | None = None
        self._closed = False
        try:
            with self._tx() as db:
                db.execute("SELECT pg_advisory_xact_lock(hashtext('proctor_store_schema'))")
                db.execute(_SCHEMA)
        except StoreError as exc:
            raise StoreError(f"cannot open run store {self._shown}: {exc}") from None

    def __repr__(self) -> str:
        return f"PostgresRunStore({self._shown!r})"

    def _connection(self) -> psycopg.Connection[Any]:
        if self._closed:
            raise StoreError(f"run store {self._shown} is closed")
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.url, autocommit=True, connect_timeout=self._timeout)
            self._conn.execute("SET synchronous_commit = on")  # (not `options=`: it would replace the URL's)
        return self._conn

    def _drop(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except psycopg.Error:
                pass
            self._conn = None

    @contextmanager
    def _tx(self, *, durable: bool = True) -> Iterator[psycopg.Connection[Any]]:
        """One transaction on the store's connection: committed, or rolled back on any error."""
        with self._lock:
            try:
                conn = self._connection()
                with conn.transaction():
                    if not durable:
                        conn.execute("SET LOCAL synchronous_commit = off")
                    yield conn
            except psycopg.Error as exc:
                if isinstance(exc, psycopg.OperationalError):
                    self._drop()
                first = (str(exc).strip().splitlines() or [""])[0]
                raise StoreError(f"run store {self._shown}: {type(exc).__name__}: {first}") from None

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._tx() as db:
            return list(db.execute(sql, params).fetchall())

    # -- runs -------------------------------------------------------------------------------------

    def create_run(self, record: RunRecord) -> RunRecord:
        now = time.time_ns()
        stored = record.evolve(version=1, created_at_ns=record.created_at_ns or now, updated_at_ns=now)
        with self._tx() as db:
            done = db.execute("INSERT INTO proctor_runs (run_id, status, updated_at_ns, version, data) "
                              "VALUES (%s, %s, %s, 1, %s) ON CONFLICT (run_id) DO NOTHING",
                              (stored.run_id, stored.status, now, Jsonb(stored.as_dict())))
            if done.rowcount != 1:
                raise StoreError(f"run {record.run_id} already exists in {self._shown}")
        return stored

    def save_run(self, record: RunRecord) -> RunRecord:
        now = time.time_ns()
        with self._tx() as db:
            row = db.execute("SELECT version FROM proctor_runs WHERE run_id = %s FOR UPDATE",
                             (record.run_id,)).fetchone()
            if row is None:
                raise RunNotFound(f"no run {record.run_id} in {self._shown}")
            if row[0] != record.version:
                raise StoreConflict(f"run {record.run_id} was changed by someone else (version {row[0]}, "
                                    f"saving {record.version}): read it again")
            stored = record.evolve(version=record.version + 1, updated_at_ns=now)
            db.execute("UPDATE proctor_runs SET status = %s, updated_at_ns = %s, version = %s, data = %s "
                       "WHERE run_id = %s",
                       (stored.status, now, stored.version, Jsonb(stored.as_dict()), stored.run_id))
        return stored

    def get_run(self, run_id: str) -> RunRecord:
        rows = self._query("SELECT data FROM proctor_runs WHERE run_id = %s", (run_id,))
        if not rows:
            raise RunNotFound(f"no run {run_id} in {self._shown} (see `proctor runs list`)")
        return RunRecord.from_dict(rows[0][0])

    def list_runs(self, *, status: RunState | None = None, limit: int = 100) -> list[RunRecord]:
        if status is None:
            rows = self._query("SELECT data FROM proctor_runs ORDER BY updated_at_ns DESC LIMIT %s", (limit,))
        else:
            rows = self._query("SELECT data FROM proctor_runs WHERE status = %s ORDER BY updated_at_ns DESC "
                               "LIMIT %s", (status, limit))
        return [RunRecord.from_dict(r[0]) for r in rows]

    def claim_run(self, run_id: str, owner: str, lease_s: float = 60.0) -> bool:
        now = time.time_ns()
        with self._tx() as db:
            row = db.execute("SELECT owner, lease_until_ns FROM proctor_runs WHERE run_id = %s FOR UPDATE",
                             (run_id,)).fetchone()
            if row is None:
                raise RunNotFound(f"no run {run_id} in {self._shown}")
            holder, until = row
            if holder is not None and holder != owner and until > now:
                return False
            db.execute("UPDATE proctor_runs SET owner = %s, lease_until_ns = %s WHERE run_id = %s",
                       (owner, now + int(lease_s * 1e9), run_id))
            return True

    def release_run(self, run_id: str, owner: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE proctor_runs SET owner = NULL, lease_until_ns = 0 WHERE run_id = %s AND owner = %s",
                       (run_id, owner))

    def cancel_run(self, run_id: str, reason: str = "") -> RunRecord:
        now = time.time_ns()
        with self._tx() as db:
            row = db.execute("SELECT data FROM proctor_runs WHERE run_id = %s FOR UPDATE", (run_id,)).fetchone()
            if row is None:
                raise RunNotFound(f"no run {run_id} in {self._shown}")
            record = RunRecord.from_dict(row[0])
            if record.status not in ("running", "suspended"):
                return record
            record = record.evolve(status="cancelled", error=reason or "cancelled", pending=(),
                                   version=record.version + 1, updated_at_ns=now)
            db.execute("UPDATE proctor_runs SET status = %s, updated_at_ns = %s, version = %s, data = %s "
                       "WHERE run_id = %s", (record.status, now, record.version, Jsonb(record.as_dict()), run_id))
            for aid, data in db.execute("SELECT id, data FROM proctor_approvals WHERE run_id = %s "
                                        "AND status = 'pending' FOR UPDATE", (run_id,)).fetchall():
                self._set_approval(db, aid, data, "void", None)
        return record

    # -- journal ----------------------------------------------------------------------------------

    def journal_write(self, entry: JournalEntry, *, durable: bool = True) -> None:
        data = entry.as_dict()
        if not data["ts_ns"]:
            data["ts_ns"] = time.time_ns()
        with self._tx(durable=durable) as db:
            db.execute("INSERT INTO proctor_journal (run_id, step, seq, data) VALUES (%s, %s, %s, %s) "
                       "ON CONFLICT (run_id, step, seq) DO UPDATE SET data = EXCLUDED.data",
                       (entry.run_id, entry.step, entry.seq, Jsonb(data)))

    def journal(self, run_id: str, step: int) -> list[JournalEntry]:
        rows = self._query("SELECT data FROM proctor_journal WHERE run_id = %s AND step = %s ORDER BY seq",
                           (run_id, step))
        return [JournalEntry.from_dict(r[0]) for r in rows]

    # -- approvals --------------------------------------------------------------------------------

    def file_approval(self, approval: PendingApproval) -> PendingApproval:
        with self._tx() as db:
            db.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (approval.binding,))
            found = db.execute("SELECT data FROM proctor_approvals WHERE binding = %s AND status <> 'void' "
                               "ORDER BY requested_at_ns DESC LIMIT 1", (approval.binding,)).fetchone()
            if found is not None:
                return PendingApproval.from_dict(found[0])
            for aid, data in db.execute(
                "SELECT id, data FROM proctor_approvals WHERE run_id = %s AND call_id = %s AND status = 'pending' "
                "FOR UPDATE", (approval.run_id, approval.call_id),
            ).fetchall():
                self._set_approval(db, aid, data, "void", None)
            stored = PendingApproval.from_dict({
                **approval.as_dict(), "id": approval.id or new_id("apr_"), "status": "pending", "answer": None,
                "requested_at_ns": approval.requested_at_ns or time.time_ns(),
            })
            db.execute("INSERT INTO proctor_approvals (id, run_id, call_id, binding, status, requested_at_ns, data) "
                       "VALUES (%s, %s, %s, %s, %s, %s, %s)",
                       (stored.id, stored.run_id, stored.call_id, stored.binding, stored.status,
                        stored.requested_at_ns, Jsonb(_approval_data(stored))))
        return stored

    def get_approval(self, approval_id: str) -> PendingApproval:
        rows = self._query("SELECT data FROM proctor_approvals WHERE id = %s", (approval_id,))
        if not rows:
            raise ApprovalNotFound(f"no approval {approval_id} in {self._shown} (see `proctor approvals list`)")
        return PendingApproval.from_dict(rows[0][0])

    def list_approvals(self, *, status: ApprovalState | None = "pending", run_id: str | None = None
                       ) -> list[PendingApproval]:
        sql, params = "SELECT data FROM proctor_approvals WHERE true", list[str]()
        if status is not None:
            sql += " AND status = %s"
            params.append(status)
        if run_id is not None:
            sql += " AND run_id = %s"
            params.append(run_id)
        rows = self._query(sql + " ORDER BY requested_at_ns DESC, id", tuple(params))
        return [PendingApproval.from_dict(r[0]) for r in rows]

    def answer_approval(self, approval_id: str, answer: ApprovalAnswer, *, binding: str) -> PendingApproval:
        with self._tx() as db:
            row = db.execute("SELECT data FROM proctor_approvals WHERE id = %s FOR UPDATE",
                             (approval_id,)).fetchone()
            if row is None:
                raise ApprovalNotFound(f"no approval {approval_id} in {self._shown}")
            data = row[0]
            current = PendingApproval.from_dict(data)
            if binding != current.binding:
                raise ApprovalConflict(f"approval {approval_id}: the answer is bound to another call, other "
                                       "arguments or another policy; look at it again and answer the current one")
            if current.status != "pending":
                raise ApprovalConflict(f"approval {approval_id} is already {current.status}; nothing to answer")
            stamped = ApprovalAnswer(answer.verdict, answer.approver, answer.reason,
                                     dict(answer.args) if answer.args is not None else None,
                                     dict(answer.grant) if answer.grant is not None else None,
                                     answer.answered_at_ns or time.time_ns())
            return self._set_approval(db, approval_id, data, "answered", stamped)

    def void_approval(self, approval_id: str, reason: str = "") -> None:
        with self._tx() as db:
            row = db.execute("SELECT data FROM proctor_approvals WHERE id = %s AND status = 'pending' FOR UPDATE",
                             (approval_id,)).fetchone()
            if row is not None:
                self._set_approval(db, approval_id, row[0], "void", None)

    def wait_for_answer(self, approval_id: str, timeout_s: float) -> PendingApproval:
        """Sleep on LISTEN until the approval is answered or voided (by anyone, anywhere), or `timeout_s` passes."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        current = self.get_approval(approval_id)
        if current.status != "pending" or timeout_s <= 0:
            return current
        try:
            listener = psycopg.connect(self.url, autocommit=True, connect_timeout=self._timeout)
        except psycopg.Error as exc:
            raise StoreError(f"run store {self._shown}: cannot listen for answers: {exc}") from None
        try:
            listener.execute(f"LISTEN {_CHANNEL}")
            while True:
                # Read after LISTEN: an answer committed before it is seen here, one after it is notified.
                current = self.get_approval(approval_id)
                left = deadline - time.monotonic()
                if current.status != "pending" or left <= 0:
                    return current
                for note in listener.notifies(timeout=min(left, 5.0), stop_after=1):
                    if note.payload == approval_id:
                        break
        except psycopg.Error as exc:
            raise StoreError(f"run store {self._shown}: lost the connection waiting for an answer: {exc}") from None
        finally:
            listener.close()

    @staticmethod
    def _set_approval(db: psycopg.Connection[Any], approval_id: str, data: dict[str, Any], status: str,
                      answer: ApprovalAnswer | None) -> PendingApproval:
        data = {**data, "status": status, "answer": answer.as_dict() if answer else data.get("answer")}
        db.execute("UPDATE proctor_approvals SET status = %s, data = %s WHERE id = %s",
                   (status, Jsonb(data), approval_id))
        db.execute("SELECT pg_notify(%s, %s)", (_CHANNEL, approval_id))  # delivered when this commits
        return PendingApproval.from_dict(data)

    # -- lifecycle --------------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._drop()
                self._closed = True


def _approval_data(approval: PendingApproval) -> dict[str, Any]:
    data = approval.as_dict()
    data.pop("requested_at", None)
    return data


register_scheme("postgresql", PostgresRunStore)
register_scheme("postgres", PostgresRunStore)
