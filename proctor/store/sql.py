"""What the SQLite and PostgreSQL run stores share: every statement and rule but the dialect.

Both keep the same three tables (a few columns to query by, the record itself as
JSON) and the same rules: optimistic versions on runs, leases for claims, one live
approval per binding, answers checked against the binding they were asked under.
A subclass says only how its engine differs — placeholders, row locks, JSON
columns, how a write is made durable, how waiters hear of an answer — through the
small set of hooks below, so a rule fixed here is fixed for both.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any, Literal, Protocol

from proctor.calls import JSONValue, new_id
from proctor.canonical import json_shaped
from proctor.errors import (
    ApprovalConflict,
    ApprovalExpired,
    ApprovalNotFound,
    RunNotFound,
    RunTakenOver,
    StoreConflict,
    StoreError,
)
from proctor.store.base import (
    ApprovalAnswer,
    ApprovalState,
    JournalEntry,
    PendingApproval,
    RunRecord,
    RunState,
    RunStore,
)

__all__ = ["Cursor", "Db", "SQLRunStore", "schema"]


class Cursor(Protocol):
    """The part of a DB-API cursor the stores use (sqlite3 and psycopg both have it)."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Sequence[JSONValue] | None: ...

    def fetchall(self) -> list[Sequence[JSONValue]]: ...


class Db(Protocol):
    """A connection inside one transaction: `execute` with ``?`` placeholders already translated."""

    def execute(self, sql: str, params: Sequence[JSONValue] = ..., /) -> Cursor: ...


def schema(prefix: str, *, text: str, bigint: str, json: str, without_rowid: str = "") -> str:
    """The tables' DDL for one engine: names start with `prefix`; the column types are the engine's."""
    return f"""
CREATE TABLE IF NOT EXISTS {prefix}runs (
    run_id {text} PRIMARY KEY,
    status {text} NOT NULL,
    updated_at_ns {bigint} NOT NULL,
    version {bigint} NOT NULL,
    owner {text},
    lease_until_ns {bigint} NOT NULL DEFAULT 0,
    data {json} NOT NULL
);
CREATE INDEX IF NOT EXISTS {prefix}runs_by_status ON {prefix}runs (status, updated_at_ns);
CREATE TABLE IF NOT EXISTS {prefix}journal (
    run_id {text} NOT NULL,
    step INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    data {json} NOT NULL,
    PRIMARY KEY (run_id, step, seq)
){without_rowid};
CREATE TABLE IF NOT EXISTS {prefix}approvals (
    id {text} PRIMARY KEY,
    run_id {text} NOT NULL,
    call_id {text} NOT NULL,
    binding {text} NOT NULL,
    status {text} NOT NULL,
    requested_at_ns {bigint} NOT NULL,
    data {json} NOT NULL
);
CREATE INDEX IF NOT EXISTS {prefix}approvals_by_status ON {prefix}approvals (status, requested_at_ns);
CREATE INDEX IF NOT EXISTS {prefix}approvals_by_call ON {prefix}approvals (run_id, call_id);
CREATE INDEX IF NOT EXISTS {prefix}approvals_by_binding ON {prefix}approvals (binding);
CREATE TABLE IF NOT EXISTS {prefix}halts (
    id {text} PRIMARY KEY,
    set_at_ns {bigint} NOT NULL,
    lifted_at_ns {bigint},
    data {json} NOT NULL
);
CREATE INDEX IF NOT EXISTS {prefix}halts_active ON {prefix}halts (lifted_at_ns);
"""


class SQLRunStore(RunStore):
    """A `RunStore` over one SQL connection; subclasses supply the engine (see the module docstring).

    Statements are written once with ``?`` placeholders and ``{runs}``/``{journal}``/
    ``{approvals}`` table names; `_sql` turns them into the engine's text.
    """

    #: Table name prefix ("" for SQLite files made before the PostgreSQL store existed).
    prefix: str = ""
    #: The engine's placeholder for ``?``.
    placeholder: str = "?"
    #: Appended to reads that will be written in the same transaction (PostgreSQL row locks; SQLite
    #: takes its write lock when the transaction begins, so it needs none).
    for_update: str = ""
    #: Where this store is, for messages (a path, or a URL with the password masked).
    where: str
    #: How to open this store again (a path, or its URL with the password): where its halts are read.
    url: str

    @property
    def halts_at(self) -> tuple[Literal["store"], str]:
        """Where `proctor halt --store URL` keeps the halts of the fleet sharing this store: its ``halts`` table.
        A gate whose runs use this store honours them (`proctor.halt.SharesHalts`)."""
        return ("store", self.url)

    # -- the engine's hooks -------------------------------------------------------------------------

    def _tx(self, *, durable: bool = True) -> AbstractContextManager[Db]:
        """One write transaction, committed or rolled back; engine errors become `StoreError`."""
        raise NotImplementedError

    def _encode(self, data: dict[str, Any]) -> Any:
        """A record as the engine stores it in a JSON column."""
        raise NotImplementedError

    def _decode(self, value: Any) -> dict[str, Any]:
        """A JSON column's value as a dict."""
        raise NotImplementedError

    def _lock_binding(self, db: Db, binding: str) -> None:
        """Serialise concurrent filings of one binding (SQLite's write lock already does)."""

    def _notify(self, db: Db, approval_id: str) -> None:
        """Tell waiters, on commit, that an approval changed (SQLite's waiters poll instead)."""

    # -- plumbing -------------------------------------------------------------------------------------

    def _sql(self, text: str) -> str:
        p = self.prefix
        return text.format(runs=f"{p}runs", journal=f"{p}journal", approvals=f"{p}approvals", halts=f"{p}halts",
                           lock=self.for_update).replace("?", self.placeholder)

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        with self._tx() as db:
            return list(db.execute(self._sql(sql), params).fetchall())

    def _run_row(self, db: Db, run_id: str, columns: str) -> Any:
        row = db.execute(self._sql(f"SELECT {columns} FROM {{runs}} WHERE run_id = ?{{lock}}"), (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(f"no run {run_id} in {self.where}")
        return row

    def _write_run(self, db: Db, record: RunRecord) -> None:
        db.execute(self._sql("UPDATE {runs} SET status = ?, updated_at_ns = ?, version = ?, data = ? WHERE run_id = ?"),
                   (record.status, record.updated_at_ns, record.version, self._encode(record.as_dict()),
                    record.run_id))

    def _pending(self, db: Db, where: str, params: tuple[str, ...]) -> Iterator[tuple[str, dict[str, Any]]]:
        rows = db.execute(self._sql(f"SELECT id, data FROM {{approvals}} WHERE {where} AND status = 'pending'{{lock}}"),
                          params).fetchall()
        for aid, data in rows:
            yield aid, self._decode(data)

    def _set_approval(self, db: Db, approval_id: str, data: dict[str, Any], status: str,
                      answer: ApprovalAnswer | None) -> PendingApproval:
        data = {**data, "status": status, "answer": answer.as_dict() if answer else data.get("answer")}
        db.execute(self._sql("UPDATE {approvals} SET status = ?, data = ? WHERE id = ?"),
                   (status, self._encode(data), approval_id))
        self._notify(db, approval_id)
        return PendingApproval.from_dict(data)

    # -- runs -----------------------------------------------------------------------------------------

    def create_run(self, record: RunRecord) -> RunRecord:
        now = time.time_ns()
        stored = record.evolve(version=1, created_at_ns=record.created_at_ns or now, updated_at_ns=now)
        with self._tx() as db:
            done = db.execute(self._sql("INSERT INTO {runs} (run_id, status, updated_at_ns, version, data) "
                                        "VALUES (?, ?, ?, 1, ?) ON CONFLICT (run_id) DO NOTHING"),
                              (stored.run_id, stored.status, now, self._encode(stored.as_dict())))
            if done.rowcount != 1:
                raise StoreError(f"run {record.run_id} already exists in {self.where}")
        return stored

    def save_run(self, record: RunRecord) -> RunRecord:
        with self._tx() as db:
            (version,) = self._run_row(db, record.run_id, "version")
            if version != record.version:
                raise StoreConflict(f"run {record.run_id} was changed by someone else (version {version}, "
                                    f"saving {record.version}): read it again")
            stored = record.evolve(version=record.version + 1, updated_at_ns=time.time_ns())
            self._write_run(db, stored)
        return stored

    def get_run(self, run_id: str) -> RunRecord:
        rows = self._query("SELECT data FROM {runs} WHERE run_id = ?", (run_id,))
        if not rows:
            raise RunNotFound(f"no run {run_id} in {self.where} (see `proctor runs list`)")
        return RunRecord.from_dict(self._decode(rows[0][0]))

    def list_runs(self, *, status: RunState | None = None, limit: int = 100) -> list[RunRecord]:
        if status is None:
            rows = self._query("SELECT data FROM {runs} ORDER BY updated_at_ns DESC LIMIT ?", (limit,))
        else:
            rows = self._query("SELECT data FROM {runs} WHERE status = ? ORDER BY updated_at_ns DESC LIMIT ?",
                               (status, limit))
        return [RunRecord.from_dict(self._decode(r[0])) for r in rows]

    def claim_run(self, run_id: str, owner: str, lease_s: float = 60.0) -> bool:
        now = time.time_ns()
        with self._tx() as db:
            holder, until = self._run_row(db, run_id, "owner, lease_until_ns")
            if holder is not None and holder != owner and until > now:
                return False
            db.execute(self._sql("UPDATE {runs} SET owner = ?, lease_until_ns = ? WHERE run_id = ?"),
                       (owner, now + int(lease_s * 1e9), run_id))
            return True

    def release_run(self, run_id: str, owner: str) -> None:
        with self._tx() as db:
            db.execute(self._sql("UPDATE {runs} SET owner = NULL, lease_until_ns = 0 WHERE run_id = ? AND owner = ?"),
                       (run_id, owner))

    def cancel_run(self, run_id: str, reason: str = "") -> RunRecord:
        with self._tx() as db:
            (data,) = self._run_row(db, run_id, "data")
            record = RunRecord.from_dict(self._decode(data))
            if record.status not in ("running", "suspended"):
                return record
            record = record.evolve(status="cancelled", error=reason or "cancelled", pending=(),
                                   version=record.version + 1, updated_at_ns=time.time_ns())
            self._write_run(db, record)
            for aid, pending in list(self._pending(db, "run_id = ?", (run_id,))):
                self._set_approval(db, aid, pending, "void", None)
        return record

    # -- journal --------------------------------------------------------------------------------------

    def journal_write(self, entry: JournalEntry, *, durable: bool = True, owner: str | None = None) -> None:
        data = entry.as_dict()
        if not data["ts_ns"]:
            data["ts_ns"] = time.time_ns()
        with self._tx(durable=durable) as db:
            if owner is not None:
                (holder,) = self._run_row(db, entry.run_id, "owner")
                if holder != owner:
                    raise RunTakenOver(f"run {entry.run_id}: this process no longer holds it ("
                                        f"{f'{holder} took it over' if holder else 'it was given back'} after this "
                                        "process's lease ran out): nothing more of it is written or run here")
            db.execute(self._sql("INSERT INTO {journal} (run_id, step, seq, data) VALUES (?, ?, ?, ?) "
                                 "ON CONFLICT (run_id, step, seq) DO UPDATE SET data = excluded.data"),
                       (entry.run_id, entry.step, entry.seq, self._encode(data)))

    def journal(self, run_id: str, step: int) -> list[JournalEntry]:
        rows = self._query("SELECT data FROM {journal} WHERE run_id = ? AND step = ? ORDER BY seq", (run_id, step))
        return [JournalEntry.from_dict(self._decode(r[0])) for r in rows]

    # -- approvals ------------------------------------------------------------------------------------

    def file_approval(self, approval: PendingApproval) -> PendingApproval:
        with self._tx() as db:
            self._lock_binding(db, approval.binding)
            found = db.execute(self._sql("SELECT data FROM {approvals} WHERE binding = ? AND status <> 'void' "
                                         "ORDER BY requested_at_ns DESC LIMIT 1"), (approval.binding,)).fetchone()
            if found is not None:
                return PendingApproval.from_dict(self._decode(found[0]))
            for aid, pending in list(self._pending(db, "run_id = ? AND call_id = ?",
                                                   (approval.run_id, approval.call_id))):
                self._set_approval(db, aid, pending, "void", None)
            stored = PendingApproval.from_dict({
                **approval.as_dict(), "id": approval.id or new_id("apr_"), "status": "pending", "answer": None,
                "requested_at_ns": approval.requested_at_ns or time.time_ns(),
            })
            data = stored.as_dict()
            data.pop("requested_at", None)
            db.execute(self._sql("INSERT INTO {approvals} (id, run_id, call_id, binding, status, requested_at_ns, "
                                 "data) VALUES (?, ?, ?, ?, ?, ?, ?)"),
                       (stored.id, stored.run_id, stored.call_id, stored.binding, stored.status,
                        stored.requested_at_ns, self._encode(data)))
        return stored

    def get_approval(self, approval_id: str) -> PendingApproval:
        rows = self._query("SELECT data FROM {approvals} WHERE id = ?", (approval_id,))
        if not rows:
            raise ApprovalNotFound(f"no approval {approval_id} in {self.where} (see `proctor approvals list`)")
        return PendingApproval.from_dict(self._decode(rows[0][0]))

    def list_approvals(self, *, status: ApprovalState | None = "pending", run_id: str | None = None
                       ) -> list[PendingApproval]:
        sql, params = "SELECT data FROM {approvals} WHERE 1 = 1", list[str]()
        if status in ("pending", "expired"):  # a pending one past its deadline is read as expired
            sql += " AND status IN ('pending', 'expired')"
        elif status is not None:
            sql += " AND status = ?"
            params.append(status)
        if run_id is not None:
            sql += " AND run_id = ?"
            params.append(run_id)
        rows = self._query(sql + " ORDER BY requested_at_ns DESC, id", tuple(params))
        found = [PendingApproval.from_dict(self._decode(r[0])) for r in rows]
        return [a for a in found if status is None or a.status == status]

    def answer_approval(self, approval_id: str, answer: ApprovalAnswer, *, binding: str) -> PendingApproval:
        with self._tx() as db:
            row = db.execute(self._sql("SELECT data FROM {approvals} WHERE id = ?{lock}"), (approval_id,)).fetchone()
            if row is None:
                raise ApprovalNotFound(f"no approval {approval_id} in {self.where}")
            data = self._decode(row[0])
            current = PendingApproval.from_dict(data)
            if binding != current.binding:
                raise ApprovalConflict(f"approval {approval_id}: the answer is bound to another call, other "
                                       "arguments or another policy; look at it again and answer the current one")
            expired = current.status == "expired"
            if expired:  # recorded as such, then refused (outside the transaction, which must commit)
                self._set_approval(db, approval_id, data, "expired", None)
            elif current.status != "pending":
                raise ApprovalConflict(f"approval {approval_id} is already {current.status}; nothing to answer")
            else:
                stamped = replace(answer, answered_at_ns=answer.answered_at_ns or time.time_ns())
                return self._set_approval(db, approval_id, data, "answered", stamped)
        raise ApprovalExpired(f"approval {approval_id} expired at {_when(current.expires_at_ns)} (the policy's "
                              "approval timeout): no answer is taken after it; the call ends as on_timeout says")

    def reopen_approval(self, approval_id: str, answer: ApprovalAnswer) -> bool:
        with self._tx() as db:
            row = db.execute(self._sql("SELECT data FROM {approvals} WHERE id = ? AND status = 'answered'{lock}"),
                             (approval_id,)).fetchone()
            if row is None:
                return False
            data = self._decode(row[0])
            held = PendingApproval.from_dict(data).answer  # (read as every reader reads it)
            if held is None or json_shaped(held.as_dict()) != json_shaped(answer.as_dict()):
                return False
            self._set_approval(db, approval_id, {**data, "answer": None}, "pending", None)
            return True

    def expire_approval(self, approval_id: str) -> None:
        """Record that a pending approval's deadline passed (no-op for any other)."""
        with self._tx() as db:
            for aid, pending in list(self._pending(db, "id = ?", (approval_id,))):
                self._set_approval(db, aid, pending, "expired", None)

    def void_approval(self, approval_id: str, reason: str = "") -> None:
        with self._tx() as db:
            for aid, pending in list(self._pending(db, "id = ?", (approval_id,))):
                self._set_approval(db, aid, pending, "void", None)

    # -- halts (proctor.halt.sql): rows kept after lifting, so the table is also their history ------

    def set_halt(self, halt: dict[str, Any]) -> None:
        """Store an active halt (`proctor.halt.Halt.as_dict()`); `StoreError` if its id exists."""
        with self._tx() as db:
            if db.execute(self._sql("SELECT 1 FROM {halts} WHERE id = ?"), (halt["id"],)).fetchone() is not None:
                raise StoreError(f"run store {self.where}: a halt {halt['id']!r} exists already")
            db.execute(self._sql("INSERT INTO {halts} (id, set_at_ns, lifted_at_ns, data) VALUES (?, ?, NULL, ?)"),
                       (halt["id"], int(halt["at_ns"]), self._encode(halt)))

    def lift_halt(self, halt_id: str, lifted: dict[str, Any]) -> dict[str, Any] | None:
        """End the active halt `halt_id`, noting `lifted` (who, why, when) in its row; its data, or None if
        no such halt is active."""
        with self._tx() as db:
            row = db.execute(self._sql("SELECT data FROM {halts} WHERE id = ? AND lifted_at_ns IS NULL{lock}"),
                             (halt_id,)).fetchone()
            if row is None:
                return None
            data = self._decode(row[0])
            db.execute(self._sql("UPDATE {halts} SET lifted_at_ns = ?, data = ? WHERE id = ?"),
                       (time.time_ns(), self._encode({**data, "lifted": lifted}), halt_id))
            return data

    def active_halts(self) -> list[tuple[str, dict[str, Any]]]:
        """Every halt not lifted, oldest first, as (row id, data) (rows as stored: the caller checks them)."""
        rows = self._query("SELECT id, data FROM {halts} WHERE lifted_at_ns IS NULL ORDER BY set_at_ns, id")
        return [(row[0], self._decode(row[1])) for row in rows]




def _when(ns: int | None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns / 1e9)) if ns else "its deadline"
