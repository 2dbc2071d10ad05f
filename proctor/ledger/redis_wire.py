"""The ledger's own path to Redis: its scripts, pre-encoded, on connections it keeps idle.

redis-py's client wraps each command in machinery the ledger does not need — a pool
checkout that probes the socket for stale data, a retry wrapper, event dispatch,
metrics hooks — which on a small VM costs about 100 µs a command, three times a
loopback round trip (bench/fleet_redis.py shows both). The ledger only ever sends
EVALSHA of its own few scripts, so it encodes them itself (RESP; the parts that do
not change per call — keys, limits — once per claim set) and writes them on
connections it holds in an idle list: one connection while one thread calls, one
more for each thread calling at the same moment (list.pop/append are atomic, so no
lock is taken). redis-py still makes the connections (URL, TLS, auth, timeouts) and
parses the replies, with hiredis when it is installed (the `redis` extra brings it).
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import redis
from redis.exceptions import NoScriptError, ResponseError

__all__ = ["Script", "Wire", "bulk", "command"]


def bulk(value: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%b\r\n" % (len(value), value)


def command(*parts: bytes) -> bytes:
    """A whole RESP command (for the few sent unencoded ahead: PING)."""
    return b"*%d\r\n" % len(parts) + b"".join(bulk(p) for p in parts)


class Script:
    """A Lua script, called by its SHA1 (EVALSHA) and loaded by its body (EVAL) when Redis lacks it."""

    __slots__ = ("body", "evalsha")

    def __init__(self, body: str) -> None:
        raw = body.encode("utf-8")
        self.body = b"$4\r\nEVAL\r\n" + bulk(raw)
        self.evalsha = b"$7\r\nEVALSHA\r\n" + bulk(hashlib.sha1(raw, usedforsecurity=False).hexdigest().encode())


class Wire:
    """Connections to one Redis, each carrying one command and its reply at a time."""

    def __init__(self, pool: redis.ConnectionPool) -> None:
        self._pool = pool
        self._idle: list[Any] = []
        self._pid = os.getpid()

    def run(self, script: Script, count: int, tail: bytes) -> Any:
        """Run `script` with `tail` (numkeys, keys and args, `count` RESP strings in all); one round trip.

        The first call after Redis lost its script cache (a restart) gets NOSCRIPT and is
        sent again whole, which loads the script for the next ones. Raises redis.RedisError.
        """
        head = b"*%d\r\n" % (count + 2)
        try:
            return self.call(head + script.evalsha + tail)
        except NoScriptError:
            return self.call(head + script.body + tail)

    def call(self, packed: bytes) -> Any:
        """Send one packed command and return its reply (an error reply raises, as redis-py's do)."""
        if self._pid != os.getpid():  # a forked child must not share its parent's sockets
            self._idle, self._pid = [], os.getpid()
        try:
            conn = self._idle.pop()
        except IndexError:
            # Made as the pool would, without its count (a pool refuses past max_connections, and
            # connections dropped after errors would add up to that).
            conn = self._pool.connection_class(**self._pool.connection_kwargs)
        try:
            conn.send_packed_command((packed,), check_health=False)
            reply = conn.read_response()
        except ResponseError:
            self._idle.append(conn)  # an error reply leaves the connection in step
            raise
        except BaseException:
            conn.disconnect()  # a timeout or a lost connection: a late reply must not meet the next command
            raise
        self._idle.append(conn)
        return reply

    def close(self) -> None:
        """Close the idle connections (one in use is closed when its command ends)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.disconnect()
