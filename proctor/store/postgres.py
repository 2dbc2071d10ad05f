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

from proctor.errors import StoreError
from proctor.pgconn import READ_COMMITTED, PgConnection, why
from proctor.store.base import PendingApproval
from proctor.store.sql import Db, SQLRunStore, schema
from proctor.urls import shown_url

__all__ = ["PostgresRunStore"]

_CHANNEL = "proctor_approvals"
_SCHEMA = schema("proctor_", text="text", bigint="bigint", json="jsonb")


class PostgresRunStore(SQLRunStore):
    """A `RunStore` in PostgreSQL (see the module docstring)."""

    prefix = "proctor_"
    placeholder = "%s"
    for_update = " FOR UPDATE"

    def __init__(self, url: str, *, connect_timeout_s: int = 5) -> None:
        self.url = url
        self._shown = self.where = shown_url(url)
        self._timeout = connect_timeout_s
        self._lock = threading.RLock()
        # READ_COMMITTED and a stalled holder's transaction ended by the server: as the audit sink's (pgconn).
        self._db = PgConnection(url, ("SET synchronous_commit = on", READ_COMMITTED,
                                      "SET idle_in_transaction_session_timeout = 10000"),
                                connect_timeout_s=connect_timeout_s)
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
        return self._db.get()

    def _drop(self) -> None:
        self._db.drop()

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
                raise StoreError(f"run store {self._shown}: {why(exc)}") from None

    def _encode(self, data: dict[str, Any]) -> Jsonb:
        return Jsonb(data)

    def _decode(self, value: Any) -> dict[str, Any]:
        decoded: dict[str, Any] = value  # psycopg has parsed the jsonb column
        return decoded

    def _lock_binding(self, db: Db, binding: str) -> None:
        db.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (binding,))

    def _notify(self, db: Db, approval_id: str) -> None:
        db.execute("SELECT pg_notify(%s, %s)", (_CHANNEL, approval_id))  # delivered when the transaction commits

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

    # -- lifecycle --------------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._drop()
                self._closed = True
