"""The ledger's own path to Redis: its scripts, pre-encoded, on sockets it keeps idle.

redis-py's client wraps each command in machinery the ledger does not need — a pool
checkout that probes the socket for stale data, a retry wrapper, event dispatch,
metrics hooks — which on a small VM costs about 100 µs a command, three times a
loopback round trip (bench/fleet_redis.py shows both). The ledger only ever sends
EVALSHA of its own few scripts, so it encodes them itself (RESP; the parts that do
not change per call — keys, limits — once per claim set) and writes them on
connections it holds in an idle list: one connection while one thread calls, one
more for each thread calling at the same moment (list.pop/append are atomic, so no
lock is taken).

redis-py still makes each connection (URL, auth, database, TLS, timeouts). On a plain
TCP or Unix socket the ledger then talks to the socket itself: one `sendall` and
(usually) one `recv_into` a command, the reply parsed by a hiredis Reader of its own.
The socket is left blocking and its timeout is the kernel's (SO_RCVTIMEO/SO_SNDTIMEO),
so no poll() precedes each read and write as with a Python socket timeout; a read that
times out fails like any lost connection: the socket is closed (a late reply must not
meet the next command) and redis.TimeoutError raised. TLS connections, and a redis-py
whose connection keeps its socket elsewhere, go through redis-py's own send and read.
"""

from __future__ import annotations

import hashlib
import os
import socket
import struct
import weakref
from typing import Any

import hiredis
import redis
from redis.exceptions import NoScriptError, ResponseError

__all__ = ["Script", "Wire", "bulk", "command"]

#: A reply larger than this is read in more than one recv (the ledger's replies are a few dozen bytes).
_BUFFER = 16384


def bulk(value: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%b\r\n" % (len(value), value)


def command(*parts: bytes) -> bytes:
    """A whole RESP command (for the few sent unencoded ahead: PING)."""
    return b"*%d\r\n" % len(parts) + b"".join(bulk(p) for p in parts)


class Script:
    """A Lua script, called by its SHA1 (EVALSHA) and loaded by its body (EVAL) when Redis lacks it."""

    __slots__ = ("body", "evalsha", "source")

    def __init__(self, body: str) -> None:
        raw = body.encode("utf-8")
        self.source = body
        self.body = b"$4\r\nEVAL\r\n" + bulk(raw)
        self.evalsha = b"$7\r\nEVALSHA\r\n" + bulk(hashlib.sha1(raw, usedforsecurity=False).hexdigest().encode())


class _Link:
    """One connection: redis-py's (which made it and closes it) and, on a plain socket, our reader of it."""

    __slots__ = ("buffer", "conn", "reader", "sock")

    def __init__(self, conn: Any, timeout_s: float | None) -> None:
        self.conn = conn
        conn.connect()  # redis-py: connect, authenticate, select the database
        sock = getattr(conn, "_sock", None)
        self.sock: socket.socket | None = None
        protocol = getattr(conn, "protocol", 2)
        if type(sock) is socket.socket and str(protocol) == "2" and _kernel_timeout(sock, timeout_s):
            self.sock = sock
            self.reader = hiredis.Reader(replyError=ResponseError)
            self.buffer = bytearray(_BUFFER)

    def close(self) -> None:
        self.conn.disconnect()


def _kernel_timeout(sock: socket.socket, timeout_s: float | None) -> bool:
    """Make `sock` blocking with the kernel's send and receive timeouts; False if the platform will not."""
    if timeout_s is None or timeout_s <= 0:
        return False
    seconds = int(timeout_s)
    value = struct.pack("ll", seconds, int((timeout_s - seconds) * 1e6))
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
    except (OSError, AttributeError, struct.error):
        return False
    sock.settimeout(None)  # blocking: the kernel times reads and writes out (EAGAIN)
    return True


#: Every Wire of this process, so that a forked child forgets its parent's sockets (at fork, not per call).
_WIRES: weakref.WeakSet[Wire] = weakref.WeakSet()


def _forget_after_fork() -> None:
    for wire in list(_WIRES):
        wire._idle = []  # the parent's sockets: neither used nor shut down here


os.register_at_fork(after_in_child=_forget_after_fork)


class Wire:
    """Connections to one Redis, each carrying one command and its reply at a time."""

    def __init__(self, pool: redis.ConnectionPool) -> None:
        self._pool = pool
        self._idle: list[_Link] = []
        timeout = pool.connection_kwargs.get("socket_timeout")
        self._timeout_s: float | None = float(timeout) if timeout else None
        _WIRES.add(self)

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
        try:
            link = self._idle.pop()
        except IndexError:
            # Made as the pool would, without its count (a pool refuses past max_connections, and
            # connections dropped after errors would add up to that).
            link = self._connect()
        sock = link.sock
        try:
            if sock is None:
                link.conn.send_packed_command((packed,), check_health=False)
                reply = link.conn.read_response()
            else:
                sock.sendall(packed)
                reader, buffer = link.reader, link.buffer
                reply = reader.gets()
                while reply is False:
                    got = sock.recv_into(buffer)
                    if not got:
                        raise ConnectionError("Redis closed the connection")
                    reader.feed(buffer, 0, got)  # type: ignore[arg-type]  # any buffer (its stub says bytes)
                    reply = reader.gets()
        except ResponseError:  # from redis-py's read: an error reply leaves the connection in step
            self._idle.append(link)
            raise
        except BlockingIOError:  # the kernel's timeout
            link.close()
            raise redis.TimeoutError(f"no answer from Redis within {self._timeout_s:g}s") from None
        except (OSError, hiredis.ProtocolError) as exc:
            link.close()
            raise redis.ConnectionError(f"{type(exc).__name__}: {exc}") from None
        except BaseException:
            link.close()  # a timeout or a lost connection: a late reply must not meet the next command
            raise
        self._idle.append(link)
        if type(reply) is ResponseError:
            if reply.args and str(reply.args[0]).startswith("NOSCRIPT"):
                raise NoScriptError(*reply.args)
            raise reply
        return reply

    def _connect(self) -> _Link:
        conn = self._pool.connection_class(**self._pool.connection_kwargs)
        try:
            return _Link(conn, self._timeout_s)
        except redis.RedisError:
            conn.disconnect()
            raise
        except OSError as exc:
            conn.disconnect()
            raise redis.ConnectionError(f"{type(exc).__name__}: {exc}") from None

    def close(self) -> None:
        """Close the idle connections (one in use is closed when its command ends)."""
        idle, self._idle = self._idle, []
        for link in idle:
            link.close()
