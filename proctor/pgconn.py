"""One PostgreSQL connection, made on first use and again once lost: what the audit sink and the run store share.

Both keep a single autocommit connection, open it lazily, set their session settings on
it (with SET, not the `options=` connection parameter, which would replace options the
URL itself gives, such as a search_path), and drop it after an error so that the next
operation reconnects.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence
from typing import Any

import psycopg

__all__ = ["PgConnection", "why"]


class PgConnection:
    """A lazily made autocommit connection to `conninfo`, with `settings` (SET statements) run on each new one."""

    def __init__(self, conninfo: str, settings: Sequence[str] = (), *, connect_timeout_s: int = 5) -> None:
        self.conninfo = conninfo
        self._settings = tuple(settings)
        self._timeout = connect_timeout_s
        self._conn: psycopg.Connection[Any] | None = None
        _ALL.add(self)

    def get(self) -> psycopg.Connection[Any]:
        """The connection, made now if there is none or it was closed (raises psycopg.Error)."""
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


def _after_fork_in_child() -> None:
    """The child shares the parent's sockets: two processes on one session would read each other's
    replies. Each connection is set aside untouched; the child's next `get` makes its own."""
    for holder in list(_ALL):
        if holder._conn is not None:
            _INHERITED.append(holder._conn)
            holder._conn = None


os.register_at_fork(after_in_child=_after_fork_in_child)


def why(exc: BaseException) -> str:
    """A database error in one line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
