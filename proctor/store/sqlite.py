"""The embedded run store: one SQLite file (stdlib `sqlite3`, WAL), shared by every process on the machine.

``RunStore.open("sqlite:///var/lib/proctor/runs.db")`` or a plain path. Each table
keeps a few columns to query by and the record itself as JSON. Commits are
``synchronous=FULL``, so a journal intent is on disk before its tool runs. Several
processes may open the same file: SQLite serialises writers (a busy writer is
waited for up to `busy_timeout_s`); `wait_for_answer` polls, cheaply (one indexed
read every 50 ms). The statements and rules are `proctor.store.sql`'s, shared with PostgreSQL.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import orjson

from proctor.errors import StoreError
from proctor.store.base import PendingApproval
from proctor.store.sql import SQLRunStore, schema
from proctor.urls import sqlite_path

__all__ = ["SQLiteRunStore", "sqlite_path"]

# Unprefixed table names: run stores made before the PostgreSQL store keep opening.
_SCHEMA = schema("", text="TEXT", bigint="INTEGER", json="TEXT", without_rowid=" WITHOUT ROWID")

#: How often `wait_for_answer` looks for a change made by another connection.
_POLL_S = 0.05


class SQLiteRunStore(SQLRunStore):
    """A `RunStore` in one SQLite file (see the module docstring)."""

    def __init__(self, url: str, *, busy_timeout_s: float = 30.0) -> None:
        self.url = url
        self.path = self.where = sqlite_path(url)
        parent = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(parent):
            raise StoreError(f"cannot open run store {self.path}: directory {parent} does not exist")
        self._busy_timeout_s = busy_timeout_s
        self._lock = threading.RLock()
        self._broken = ""  # why a forked child's connection could not be opened
        self._db = self._connect()
        with self._tx():
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self._db.execute(statement)
        self._closed = False
        _OPEN.add(self)

    def _connect(self) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(self.path, timeout=self._busy_timeout_s, isolation_level=None,
                                 check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_s * 1000)}")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open run store {self.path}: {exc}") from exc
        return db

    def reopen_after_fork(self) -> None:
        """In a forked child: use a connection of its own (SQLite forbids using one across fork()).

        The inherited connection is kept, never used nor closed: its locks and WAL state are the
        parent's. The lock is new too: a parent thread that held it at the fork never lets go here.
        A fork in the middle of a parent thread's write leaves SQLite's per-process lock table saying
        this process writes, so no connection of the child could: each use then fails at once, saying so.
        """
        self._lock = threading.RLock()
        if self._closed:
            return
        _INHERITED.append(self._db)
        if self._db.in_transaction:
            self._broken = ("this process was forked while another thread wrote to it, and SQLite's locks do "
                            "not survive fork(): open the store in a child forked outside a write, or spawned")
        else:
            try:
                self._db = self._connect()
                return
            except StoreError as exc:
                self._broken = f"{exc} (reopening it in a forked child)"
        self._db = sqlite3.connect(":memory:")  # closed at once: every use raises, with `_broken` as its reason
        self._db.close()

    def __repr__(self) -> str:
        return f"SQLiteRunStore({self.url!r})"

    @property
    def halts_at(self) -> tuple[Literal["store"], str]:
        # The file's absolute path: every gate of the process on this file shares one channel, whatever
        # directory each was opened from.
        return ("store", os.path.abspath(self.path))

    @contextmanager
    def _tx(self, *, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once (BEGIN IMMEDIATE), committed or rolled back.

        Not `durable`: WAL with synchronous=NORMAL, in the log at once and fsynced at the next checkpoint.
        """
        with self._lock:
            try:
                if not durable:
                    self._db.execute("PRAGMA synchronous=NORMAL")
                try:
                    self._db.execute("BEGIN IMMEDIATE")
                    try:
                        yield self._db
                    except BaseException:
                        self._db.execute("ROLLBACK")
                        raise
                    self._db.execute("COMMIT")
                finally:
                    if not durable:
                        self._db.execute("PRAGMA synchronous=FULL")
            except sqlite3.Error as exc:
                raise StoreError(f"run store {self.path}: {self._broken or exc}") from exc

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        """A read outside any write transaction: WAL readers never wait for writers, nor take their lock."""
        with self._lock:
            try:
                return list(self._db.execute(self._sql(sql), params))
            except sqlite3.Error as exc:
                raise StoreError(f"run store {self.path}: {self._broken or exc}") from exc

    def _encode(self, data: dict[str, Any]) -> str:
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)

    def _decode(self, value: Any) -> dict[str, Any]:
        decoded: dict[str, Any] = orjson.loads(value)
        return decoded

    def wait_for_answer(self, approval_id: str, timeout_s: float) -> PendingApproval:
        """Poll until the approval is answered or voided (cheap: one indexed read each `_POLL_S`)."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            current = self.get_approval(approval_id)
            left = deadline - time.monotonic()
            if current.status != "pending" or left <= 0:
                return current
            time.sleep(min(_POLL_S, left))

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()
                _OPEN.discard(self)


#: Every open SQLiteRunStore of this process, so that a forked child opens its own connections.
_OPEN: weakref.WeakSet[SQLiteRunStore] = weakref.WeakSet()
#: A forked child's copies of its parent's connections: kept so they are never closed (nor used) here.
_INHERITED: list[sqlite3.Connection] = []


def _after_fork_in_child() -> None:
    for store in list(_OPEN):
        store.reopen_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
