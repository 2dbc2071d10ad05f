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
from collections.abc import Callable
from typing import Any

import redis

try:  # the `redis` extra brings it; without it every connection goes through redis-py's send and read
    import hiredis
except ImportError:  # pragma: no cover - installed with the extra
    hiredis = None  # type: ignore[assignment]
from redis.exceptions import NoScriptError, ResponseError

__all__ = ["Script", "Wire", "bulk", "command"]

#: hiredis's error for bytes that are not RESP (never raised without hiredis: those links use redis-py's reader).
_ProtocolError: type[Exception] = hiredis.ProtocolError if hiredis is not None else redis.InvalidResponse

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

    __slots__ = ("buffer", "conn", "pending", "reader", "sock")

    def __init__(self, conn: Any, timeout_s: float | None) -> None:
        self.conn = conn
        #: Commands written with `Wire.send` whose replies are still to be read, in order (their notes).
        self.pending: list[Any] = []
        conn.connect()  # redis-py: connect, authenticate, select the database
        sock = getattr(conn, "_sock", None)
        self.sock: socket.socket | None = None
        protocol = getattr(conn, "protocol", 2)
        if (hiredis is not None and type(sock) is socket.socket and str(protocol) == "2"
                and _kernel_timeout(sock, timeout_s)):
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


class Wire:
    """Connections to one Redis, each carrying its commands and their replies in order.

    `call` waits for its reply. `send` does not: the reply is read by the next command on
    the same connection (or by `drain`); a note given with it comes back through `lost`
    when that reply is an error or never comes (the connection failed), so the caller
    can send it again — `send` is for commands that are safe to repeat.
    """

    #: Notes of commands sent whose replies never come back this many at a time at most.
    MAX_PENDING = 64

    def __init__(self, pool: redis.ConnectionPool, lost: Callable[[list[Any]], None] | None = None) -> None:
        self._pool = pool
        self._idle: list[_Link] = []
        timeout = pool.connection_kwargs.get("socket_timeout")
        self._timeout_s: float | None = float(timeout) if timeout else None
        self._lost = lost
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

    def send(self, script: Script, count: int, tail: bytes, note: Any) -> None:
        """Write `script`'s call (by its sha) without waiting for the reply; raises redis.RedisError if not written.

        On a TLS connection (redis-py's send and read) the reply is waited for, as by `run`.
        """
        link = self._link()
        if link.sock is None or len(link.pending) >= self.MAX_PENDING:
            self._idle.append(link)
            self.run(script, count, tail)
            return
        try:
            link.sock.sendall(b"*%d\r\n" % (count + 2) + script.evalsha + tail)
        except BaseException as exc:
            self._fail(link)
            if isinstance(exc, OSError):
                raise redis.ConnectionError(f"{type(exc).__name__}: {exc}") from None
            raise
        link.pending.append(note)
        self._idle.append(link)

    def call(self, packed: bytes) -> Any:
        """Send one packed command and return its reply (an error reply raises, as redis-py's do)."""
        link = self._link()
        try:
            if link.sock is None:
                link.conn.send_packed_command((packed,), check_health=False)
                reply = link.conn.read_response()
            else:
                link.sock.sendall(packed)
                if link.pending:
                    self._confirm(link)
                reply = self._read(link)
        except ResponseError:  # from redis-py's read: an error reply leaves the connection in step
            self._idle.append(link)
            raise
        except BlockingIOError:  # the kernel's timeout
            self._fail(link)
            raise redis.TimeoutError(f"no answer from Redis within {self._timeout_s:g}s") from None
        except (OSError, _ProtocolError) as exc:
            self._fail(link)
            raise redis.ConnectionError(f"{type(exc).__name__}: {exc}") from None
        except BaseException:
            self._fail(link)  # a late reply must not meet the next command
            raise
        self._idle.append(link)
        if type(reply) is ResponseError:
            if reply.args and str(reply.args[0]).startswith("NOSCRIPT"):
                raise NoScriptError(*reply.args)
            raise reply
        return reply

    def drain(self) -> None:
        """Read the replies of commands sent earlier on the idle connections (the keeper's and close's turn)."""
        for link in [link for link in list(self._idle) if link.pending]:
            try:
                self._idle.remove(link)  # taken meanwhile by a caller, which reads them itself
            except ValueError:
                continue
            try:
                self._confirm(link)
            except (OSError, _ProtocolError):
                self._fail(link)
                continue
            except BaseException:
                self._fail(link)
                raise
            self._idle.append(link)

    @staticmethod
    def _forget_after_fork() -> None:
        for wire in list(_WIRES):
            Wire._forget_links(wire)

    def _forget_links(self) -> None:
        self._idle = []  # the parent's sockets: neither used nor shut down here

    # Once per process, when the class is made (at fork, not per call); a staticmethod is callable here.
    os.register_at_fork(after_in_child=_forget_after_fork)

    def close(self) -> None:
        """Close the idle connections (one in use is closed when its command ends); unread replies count as lost."""
        idle, self._idle = self._idle, []
        for link in idle:
            self._fail(link)

    # -- internals ------------------------------------------------------------------------------------

    def _link(self) -> _Link:
        try:
            return self._idle.pop()
        except IndexError:
            pass
        # Made as the pool would, without its count (a pool refuses past max_connections, and
        # connections dropped after errors would add up to that).
        conn = self._pool.connection_class(**self._pool.connection_kwargs)
        try:
            return _Link(conn, self._timeout_s)
        except redis.RedisError:
            conn.disconnect()
            raise
        except OSError as exc:
            conn.disconnect()
            raise redis.ConnectionError(f"{type(exc).__name__}: {exc}") from None

    @staticmethod
    def _read(link: _Link) -> Any:
        """One reply from a plain socket (raises OSError when the socket fails or times out)."""
        reader, buffer, sock = link.reader, link.buffer, link.sock
        assert sock is not None
        reply = reader.gets()
        while reply is False:
            got = sock.recv_into(buffer)
            if not got:
                raise ConnectionError("Redis closed the connection")
            reader.feed(buffer, 0, got)  # type: ignore[arg-type]  # any buffer (its stub says bytes)
            reply = reader.gets()
        return reply

    def _confirm(self, link: _Link) -> None:
        """Read the replies owed for the commands sent on `link`; those that are errors go to `lost`."""
        failed = []
        while link.pending:
            reply = self._read(link)
            note = link.pending.pop(0)
            if type(reply) is ResponseError:
                failed.append(note)
        if failed and self._lost is not None:
            self._lost(failed)

    def _fail(self, link: _Link) -> None:
        """Close `link`; the commands sent on it whose replies were not read are lost (they may have run)."""
        pending, link.pending = link.pending, []
        link.close()
        if pending and self._lost is not None:
            self._lost(pending)
