"""One PostgreSQL connection, made on first use and again once lost: what the audit sink and the run store share.

Both keep a single autocommit connection, open it lazily, set their session settings on
it (with SET, not the `options=` connection parameter, which would replace options the
URL itself gives, such as a search_path), and drop it after an error so that the next
operation reconnects.
"""

from __future__ import annotations

import os
import select
import weakref
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import pq

__all__ = ["READ_COMMITTED", "PgConnection", "why"]

#: Every session of ours, whatever the database's default: the row locks (``SELECT … FOR UPDATE``) rely on READ
#: COMMITTED, where a writer that waited re-reads the newest row. Under a database default of REPEATABLE READ (a
#: common hardening) 4 concurrent audit writers had 19-42 of ~405 intents refused with serialization failures.
READ_COMMITTED = "SET default_transaction_isolation = 'read committed'"


class PgConnection:
    """A lazily made autocommit connection to `conninfo`, with `settings` (SET statements) run on each new one."""

    def __init__(self, conninfo: str, settings: Sequence[str] = (), *, connect_timeout_s: int = 5) -> None:
        self.conninfo = conninfo
        self._settings = tuple(settings)
        self._timeout = connect_timeout_s
        self._conn: psycopg.Connection[Any] | None = None
        _ALL.add(self)

    def get(self) -> psycopg.Connection[Any]:
        """The connection, made now if there is none, it was closed, or the server ended it while it was idle
        (raises psycopg.Error)."""
        if self._conn is not None and not self._conn.closed and _ended_while_idle(self._conn.pgconn):
            self.drop()
        if self._conn is None or self._conn.closed:
            conn = psycopg.connect(self.conninfo, autocommit=True, connect_timeout=self._timeout)
            try:
                for statement in self._settings:
                    conn.execute(statement)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    @property
    def is_open(self) -> bool:
        """Whether a connection is made (it may have broken since: `get` finds out)."""
        return self._conn is not None and not self._conn.closed

    @staticmethod
    def _after_fork_in_child() -> None:
        """The child shares the parent's sockets: two processes on one session would read each other's
        replies. Each connection is set aside untouched; the child's next `get` makes its own."""
        for holder in list(_ALL):
            PgConnection._set_aside(holder)

    def _set_aside(self) -> None:
        if self._conn is not None:
            _INHERITED.append(self._conn)
            self._conn = None

    # Once per process, when the class is made (at fork, not per call); a staticmethod is callable here.
    os.register_at_fork(after_in_child=_after_fork_in_child)

    def drop(self) -> None:
        """Close the connection (quietly: it may be broken already); the next `get` makes a new one."""
        if self._conn is not None:
            try:
                self._conn.close()
            except psycopg.Error:
                pass
            self._conn = None


#: Every PgConnection of this process, so that a forked child stops using its parent's sessions (at fork).
_ALL: weakref.WeakSet[PgConnection] = weakref.WeakSet()
#: Connections a forked child inherited: kept referenced and never closed there — closing one (or letting
#: it be collected) would send the server a Terminate on the parent's socket and end the parent's session.
_INHERITED: list[Any] = []


def _ended_while_idle(pg: pq.abc.PGconn) -> bool:
    """Whether the server may have ended this idle session (idle_session_timeout, a restart, a failover, a pooler):
    then it sent its goodbye and closed the socket before we sent anything, and sending now would fail the statement
    although the database is up. Our sessions are sent nothing unasked (no LISTEN on them), so anything to read
    while idle means that, or a rare notice: either way a new session costs a connect, a failed call costs a
    refusal. One poll, no round trip; outside a transaction only, so no statement is ever sent twice."""
    if pg.transaction_status != pq.TransactionStatus.IDLE:
        return False
    try:
        poller = select.poll()
        poller.register(pg.socket, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, psycopg.Error):
        return True


def why(exc: BaseException) -> str:
    """A database error in one line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
