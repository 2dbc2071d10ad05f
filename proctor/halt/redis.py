"""Halts shared by a fleet through Redis: the ledger's server (``--ledger redis://…``).

Layout: a hash ``{prefix}`` (halt id -> the halt as JSON) and a counter ``{prefix}:version``
bumped by every change, both written in one MULTI/EXEC (a reader sees the halts of one
version), and a PUBLISH on ``{prefix}`` for tools that want to be told. A gate's
`RedisHalts` channel reads both every `refresh_s`, in one round trip.
"""

from __future__ import annotations

import json
from typing import Any

import redis

from proctor.halt import DEFAULT_GRACE_S, DEFAULT_REFRESH_S, Halt, HaltError, PolledHalts
from proctor.urls import shown_url, split_ledger_options

__all__ = ["DEFAULT_PREFIX", "RedisHaltBackend", "RedisHalts"]

DEFAULT_PREFIX = "proctor:halts"


class RedisHaltBackend:
    """The halts kept in Redis (a `proctor.halt.HaltBackend`): what `proctor halt --ledger redis://…` writes."""

    def __init__(self, url: str, *, prefix: str | None = None, timeout_s: float = 2.0) -> None:
        """`url`: the Redis (a ledger's URL as the fleet writes it: a ``prefix=`` there names the fleet's halts,
        ``{prefix}:halts``); `prefix`: the hash's key itself, which then overrides it."""
        target, options = split_ledger_options(url)
        namespace = options.get("prefix")
        self.url = url
        self.shown = shown_url(url)
        self.prefix = prefix or (f"{namespace}:halts" if namespace else DEFAULT_PREFIX)
        self._version_key = self.prefix + ":version"
        self._client: Any = redis.Redis.from_url(target, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)

    def _fail(self, what: str, exc: Exception) -> HaltError:
        return HaltError(f"halts at {self.shown}: cannot {what}: {exc}")

    def version(self) -> int:
        try:
            raw = self._client.get(self._version_key)
        except redis.RedisError as exc:
            raise self._fail("read the version", exc) from None
        return int(raw) if raw is not None else 0

    def set(self, halt: Halt) -> Halt:
        try:
            with self._client.pipeline(transaction=True) as pipe:
                pipe.hset(self.prefix, halt.id, json.dumps(halt.as_dict(), sort_keys=True))
                pipe.incr(self._version_key)
                pipe.publish(self.prefix, halt.id)
                pipe.execute()
        except redis.RedisError as exc:
            raise self._fail("set the halt", exc) from None
        return halt

    def lift(self, halt_id: str, *, reason: str = "", by: str | None = None) -> Halt:
        found = {h.id: h for h in self.list_halts()}.get(halt_id)
        if found is None:
            raise HaltError(f"halts at {self.shown}: no active halt {halt_id!r} (proctor halt --list shows them)")
        try:
            with self._client.pipeline(transaction=True) as pipe:
                pipe.hdel(self.prefix, halt_id)
                pipe.incr(self._version_key)
                pipe.publish(self.prefix, halt_id)
                removed, _, _ = pipe.execute()
        except redis.RedisError as exc:
            raise self._fail("lift the halt", exc) from None
        if not removed:
            raise HaltError(f"halts at {self.shown}: halt {halt_id!r} was lifted meanwhile")
        return found

    def list_halts(self) -> list[Halt]:
        try:
            raw = self._client.hgetall(self.prefix)
        except redis.RedisError as exc:
            raise self._fail("read the halts", exc) from None
        return _decode(raw, self.shown)

    def snapshot(self) -> tuple[int, list[Halt]]:
        """The version and the halts of that version, read in one MULTI/EXEC."""
        try:
            with self._client.pipeline(transaction=True) as pipe:
                pipe.get(self._version_key)
                pipe.hgetall(self.prefix)
                version, raw = pipe.execute()
        except redis.RedisError as exc:
            raise self._fail("read the halts", exc) from None
        return (int(version) if version is not None else 0), _decode(raw, self.shown)

    def close(self) -> None:
        self._client.close()


def _decode(raw: dict[bytes, bytes], shown: str) -> list[Halt]:
    """Halts read from Redis (not trusted): a row that is not a valid halt fails the read (fail closed)."""
    out = []
    for key, value in raw.items():
        try:
            halt = Halt.from_dict(json.loads(value))
        except (ValueError, HaltError) as exc:
            raise HaltError(f"halts at {shown}: entry {key!r} is not a halt: {exc}") from None
        if halt.id.encode() != key:
            raise HaltError(f"halts at {shown}: entry {key!r} holds halt {halt.id!r}")
        out.append(halt)
    return sorted(out, key=lambda h: (h.at_ns, h.id))


class RedisHalts(PolledHalts):
    """A gate's `HaltChannel` on Redis: the halts (and their version) read every `refresh_s`, in one round trip.

    The whole hash is read each time rather than only when the version moved: it holds a handful of
    halts, and a counter reset by a flushed or restored Redis can never hide a change this way.
    """

    def __init__(self, url: str, *, prefix: str | None = None, refresh_s: float = DEFAULT_REFRESH_S,
                 grace_s: float = DEFAULT_GRACE_S) -> None:
        self._redis = RedisHaltBackend(url, prefix=prefix, timeout_s=min(1.0, grace_s))
        self.version = -1
        super().__init__(self._read_halts, self._redis.shown, refresh_s=refresh_s, grace_s=grace_s,
                         backend=self._redis)

    @property
    def backend(self) -> RedisHaltBackend:
        return self._redis

    def _read_halts(self) -> list[Halt]:
        self.version, halts = self._redis.snapshot()
        return halts

    def close(self) -> None:
        super().close()
        self._redis.close()
