"""`RedisLedger`: budget pools shared by a fleet of processes, in one Redis.

Each operation is one Lua script — one round trip, atomic on the server:

- reserve: for every claimed pool, give back leases that have expired, check the
  limits, then count the call in all pools and record a lease (all or nothing);
- settle: end the lease, add the duration, correct the cost; a lease that had already
  expired was given back, so the call (which ran) is counted again — once: settling
  twice changes nothing;
- release: end the lease and give back its call and cost.

A pool is a hash (`calls`, `cost`, `wall_ns`, `tok`, `usd`) at ``{prefix}b:<pool key>``
with its leases in a sorted set (``…:l``, member ``<lease id>|<reserved cost>``, score =
expiry in Redis's own milliseconds, so hosts' clocks do not matter) and the leases that
expired and were given back in ``…:x`` (kept a week, for late settles). A keeper thread
renews the leases this process holds, every third of the lease, in one script call;
a process that dies stops renewing, and its reservations come back within one lease.
The scripts go out pre-encoded on the ledger's own connections (`redis_wire`): one
round trip each, with little of redis-py's per-command work around it.

Fail closed: a reserve that cannot reach Redis, or gets no answer within the socket
timeout, raises `LedgerUnavailable`; the next call tries again (no retries inside a
call). Settles and releases that fail are kept and retried by the keeper.

URL: ``redis://[user:password@]host:6379/0?lease=15s&timeout=2s&prefix=proctor``
(``rediss://`` for TLS, ``unix:///path/redis.sock?db=0``).
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from urllib.parse import parse_qsl, urlencode

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from proctor.errors import BudgetExceeded, LedgerUnavailable
from proctor.ledger.base import DEFAULT_LEASE_S, Claim, Lease, PoolUsage
from proctor.ledger.checks import refusal
from proctor.ledger.redis_wire import Script, Wire, bulk, command
from proctor.policy.validators import parse_duration
from proctor.urls import shown_url

__all__ = ["RedisLedger"]

#: Claim sets (and key sets) whose encoding is kept; past this the cache starts again.
_CACHE = 1024

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# A lease is a member "<lease id>|<reserved cost>" of the pool's lease set (score: expiry), so no
# other key holds it. Leases that expired are given back by the next reserve, which keeps their
# members a week in the pool's ``:x`` set: a late settle finds its lease there and counts the call
# again, once; a settle that finds its lease in neither set was already done (settles repeat safely).

# KEYS: pool hashes. ARGV: lease id, lease ms, cost, then 4 per pool: calls, cost, wall_ns limits ('' = none), ttl s.
# Returns 1, or {0, failing pool index (1-based), calls, cost, wall_ns}.
_RESERVE = Script(_NOW + """
local cost = tonumber(ARGV[3])
local member, expiry = ARGV[1] .. '|' .. ARGV[3], now + tonumber(ARGV[2])
for i, key in ipairs(KEYS) do
  local z = key .. ':l'
  local dead = redis.call('ZRANGEBYSCORE', z, '-inf', now)
  if #dead > 0 then
    local x, back = key .. ':x', 0
    for _, d in ipairs(dead) do
      back = back + tonumber(string.match(d, '|(.*)$'))
      redis.call('ZADD', x, now, d)
    end
    redis.call('ZREMRANGEBYSCORE', z, '-inf', now)
    redis.call('HINCRBY', key, 'calls', -#dead)
    if back ~= 0 then redis.call('HINCRBYFLOAT', key, 'cost', -back) end
    redis.call('ZREMRANGEBYSCORE', x, '-inf', now - 604800000)
    redis.call('EXPIRE', x, 604800)
  end
  local u = redis.call('HMGET', key, 'calls', 'cost', 'wall_ns')
  local calls, used, wall = tonumber(u[1] or 0), tonumber(u[2] or 0), tonumber(u[3] or 0)
  local b = 3 + (i - 1) * 4
  local lc, lcost, lwall = ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  if (lc ~= '' and calls + 1 > tonumber(lc)) or (lcost ~= '' and used + cost > tonumber(lcost) + 1e-9)
     or (lwall ~= '' and wall >= tonumber(lwall)) then
    return {0, i, tostring(calls), tostring(used), tostring(wall)}
  end
end
for i, key in ipairs(KEYS) do
  local z = key .. ':l'
  redis.call('HINCRBY', key, 'calls', 1)
  if cost ~= 0 then redis.call('HINCRBYFLOAT', key, 'cost', cost) end
  redis.call('ZADD', z, expiry, member)
  local ttl = ARGV[3 + i * 4]
  if ttl ~= '' then redis.call('EXPIRE', key, ttl); redis.call('EXPIRE', z, ttl) end
end
return 1
""")

# KEYS: pool hashes. ARGV: lease member, duration ns, cost delta ('' = none), reserved cost. Returns 1 when late.
_SETTLE = Script("""
local member, dur, delta, reserved = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local late = 0
for _, key in ipairs(KEYS) do
  local held = redis.call('ZREM', key .. ':l', member) == 1
  if not held and redis.call('ZREM', key .. ':x', member) == 1 then
    held, late = true, 1
    redis.call('HINCRBY', key, 'calls', 1)
    if reserved ~= 0 then redis.call('HINCRBYFLOAT', key, 'cost', reserved) end
  end
  if held then
    if dur ~= '0' then redis.call('HINCRBY', key, 'wall_ns', dur) end
    if delta ~= '' then redis.call('HINCRBYFLOAT', key, 'cost', delta) end
  end
end
return late
""")

# KEYS: pool hashes. ARGV: lease member, reserved cost.
_RELEASE = Script("""
local cost = tonumber(ARGV[2])
for _, key in ipairs(KEYS) do
  if redis.call('ZREM', key .. ':l', ARGV[1]) == 1 then
    redis.call('HINCRBY', key, 'calls', -1)
    if cost ~= 0 then redis.call('HINCRBYFLOAT', key, 'cost', -cost) end
  end
end
return 1
""")

# KEYS: the lease sets (…:l) of (pool, lease) pairs. ARGV: lease ms, then one lease member per key.
_RENEW = Script(_NOW + """
local lease_ms = tonumber(ARGV[1])
for i, z in ipairs(KEYS) do redis.call('ZADD', z, 'XX', now + lease_ms, ARGV[i + 1]) end
return 1
""")

# KEYS: pool hashes. ARGV: tokens, usd.
_CHARGE = Script("""
for _, key in ipairs(KEYS) do
  redis.call('HINCRBY', key, 'tok', ARGV[1])
  redis.call('HINCRBYFLOAT', key, 'usd', ARGV[2])
end
return 1
""")

# KEYS: pool hashes. Returns, per pool, {calls, cost, wall_ns, tok, usd} after giving back expired leases' counts
# (read-only: the expired leases are purged by the next reserve; here they are only left out).
_USAGE = Script(_NOW + """
local out = {}
for i, key in ipairs(KEYS) do
  local u = redis.call('HMGET', key, 'calls', 'cost', 'wall_ns', 'tok', 'usd')
  local calls, cost = tonumber(u[1] or 0), tonumber(u[2] or 0)
  for _, d in ipairs(redis.call('ZRANGEBYSCORE', key .. ':l', '-inf', now)) do
    calls = calls - 1; cost = cost - tonumber(string.match(d, '|(.*)$'))
  end
  out[i] = {tostring(calls), tostring(cost), tostring(u[3] or 0), tostring(u[4] or 0), tostring(u[5] or 0)}
end
return out
""")


def _split_url(url: str) -> tuple[str, dict[str, str]]:
    """The URL for redis-py, and proctor's own options (lease, timeout, prefix) taken out of its query."""
    base, _, query = url.partition("?")
    ours, theirs = {}, []
    for k, v in parse_qsl(query, keep_blank_values=True):
        if k in ("lease", "timeout", "prefix"):
            ours[k] = v
        else:
            theirs.append((k, v))
    return base + ("?" + urlencode(theirs) if theirs else ""), ours


class RedisLedger:
    """Budget pools in Redis, shared by every process that names the same URL (see the module docstring)."""

    def __init__(
        self,
        url: str = "redis://localhost:6379/0",
        *,
        lease_s: float | None = None,
        timeout_s: float | None = None,
        prefix: str | None = None,
    ) -> None:
        target, options = _split_url(url)
        self.url = shown_url(url, query=False)
        self.lease_s = lease_s if lease_s is not None else (
            parse_duration(options["lease"]) if "lease" in options else DEFAULT_LEASE_S)
        self.timeout_s = timeout_s if timeout_s is not None else (
            parse_duration(options["timeout"]) if "timeout" in options else 2.0)
        # The hash tag keeps every key in one Redis Cluster slot, so each script may touch them all.
        self.prefix = "{" + (prefix or options.get("prefix") or "proctor") + "}:"
        self._wire = Wire(redis.ConnectionPool.from_url(
            target, socket_timeout=self.timeout_s, socket_connect_timeout=self.timeout_s,
            retry=Retry(NoBackoff(), 0), retry_on_timeout=False, health_check_interval=0,
        ))
        self._lease_ms = bulk(b"%d" % int(self.lease_s * 1000))
        self._fixed: dict[tuple[Claim, ...], tuple[int, bytes, bytes]] = {}
        self._keys: dict[tuple[str, ...], bytes] = {}
        self._ids = itertools.count(1)
        self._id_prefix = f"{os.getpid():x}.{os.urandom(4).hex()}."
        self._lock = threading.Lock()
        self._held: dict[str, Lease] = {}
        self._backlog: list[tuple[str, Lease, int, float | None]] = []  # (op, lease, duration_ns, cost)
        self._pid = os.getpid()
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None
        weakref.finalize(self, self._stop.set)

    def __repr__(self) -> str:
        return f"RedisLedger({self.url!r}, lease_s={self.lease_s:g})"

    def _key(self, pool: str) -> str:
        return self.prefix + "b:" + pool

    def _keys_part(self, keys: tuple[str, ...]) -> bytes:
        """numkeys and the pools' keys, encoded (cached: a process names few pools)."""
        part = self._keys.get(keys)
        if part is None:
            if len(self._keys) >= _CACHE:
                self._keys.clear()
            part = self._keys[keys] = bulk(b"%d" % len(keys)) + b"".join(bulk(self._key(k).encode()) for k in keys)
        return part

    def _fixed_part(self, claims: tuple[Claim, ...]) -> tuple[int, bytes, bytes]:
        """For a reserve of `claims`: how many RESP strings follow EVALSHA, the keys part, the limits part."""
        fixed = self._fixed.get(claims)
        if fixed is None:
            if len(self._fixed) >= _CACHE:
                self._fixed.clear()
            limits = b"".join(
                bulk(b"" if c.calls is None else b"%d" % c.calls)
                + bulk(b"" if c.cost is None else repr(float(c.cost)).encode())
                + bulk(b"" if c.wall_ns is None else b"%d" % c.wall_ns)
                + bulk(b"" if c.ttl_s is None else b"%d" % c.ttl_s)
                for c in claims)
            fixed = self._fixed[claims] = (4 + 5 * len(claims), self._keys_part(tuple(c.key for c in claims)), limits)
        return fixed

    def _ensure_keeper(self) -> None:
        if self._pid != os.getpid():  # a forked child holds none of its parent's leases
            self._pid, self._held, self._backlog = os.getpid(), {}, []
            self._lock = threading.Lock()
            self._id_prefix = f"{os.getpid():x}.{os.urandom(4).hex()}."
            self._keeper = None
        if self._keeper is None or not self._keeper.is_alive():
            self._keeper = threading.Thread(target=self._keep, name="proctor-ledger-keeper", daemon=True)
            self._keeper.start()

    # -- the protocol ---------------------------------------------------------------------------------

    def reserve(self, claims: Sequence[Claim], cost: float, *, tool: str = "") -> Lease:
        """Count one call against every claimed pool in one script, or raise BudgetExceeded/LedgerUnavailable."""
        self._ensure_keeper()
        claims = tuple(claims)
        lease = Lease(self._id_prefix + str(next(self._ids)), tuple(c.key for c in claims), float(cost))
        count, keys, limits = self._fixed_part(claims)
        try:
            result = self._wire.run(_RESERVE, count, keys + bulk(lease.id.encode()) + self._lease_ms
                                    + bulk(repr(lease.cost).encode()) + limits)
        except redis.RedisError as exc:
            raise LedgerUnavailable(f"{tool}: refused: the budget ledger {self.url} is unreachable or too slow "
                                    f"({type(exc).__name__}: {exc}); the next call tries again",
                                    tool=tool, budget=claims[0].budget if claims else "") from None  # fmt: skip
        if result != 1:
            claim = claims[int(result[1]) - 1]
            calls, used, wall = int(float(result[2])), float(result[3]), int(float(result[4]))
            problem = refusal(claim, calls, used, wall, float(cost)) or f"'{claim.budget}' exhausted"
            raise BudgetExceeded(f"{tool}: budget {problem}", tool=tool, budget=claim.budget)
        with self._lock:
            self._held[lease.id] = lease
        return lease

    def settle(self, lease: Lease, *, duration_ns: int, cost: float | None = None) -> None:
        """End the lease, keep the call counted, add its duration; retried by the keeper if Redis is away."""
        with self._lock:
            self._held.pop(lease.id, None)
        if not self._run_settle(lease, duration_ns, cost):
            with self._lock:
                self._backlog.append(("settle", lease, duration_ns, cost))

    def release(self, lease: Lease) -> None:
        """End the lease and give back its call and cost; retried by the keeper if Redis is away."""
        with self._lock:
            self._held.pop(lease.id, None)
        if not self._run_release(lease):
            with self._lock:
                self._backlog.append(("release", lease, 0, None))

    def charge(self, claims: Sequence[Claim], *, tokens: int, cost_usd: float) -> None:
        """Add a model reply's usage to the pools (raises LedgerUnavailable when Redis is away)."""
        keys = tuple(c.key for c in claims)
        try:
            self._wire.run(_CHARGE, 3 + len(keys),
                           self._keys_part(keys) + bulk(b"%d" % int(tokens)) + bulk(repr(float(cost_usd)).encode()))
        except redis.RedisError as exc:
            raise LedgerUnavailable(f"the budget ledger {self.url} is unreachable: {exc}") from None

    def usage(self, keys: Sequence[str]) -> Mapping[str, PoolUsage]:
        """What each pool has used, live leases included and expired ones left out."""
        if not keys:
            return {}
        try:
            rows = self._wire.run(_USAGE, 1 + len(keys), self._keys_part(tuple(keys)))
        except redis.RedisError as exc:
            raise LedgerUnavailable(f"the budget ledger {self.url} is unreachable: {exc}") from None
        return {
            k: PoolUsage(int(float(r[0])), _clean(float(r[1])), int(float(r[2])), int(float(r[3])), float(r[4]))
            for k, r in zip(keys, rows, strict=True)
        }

    def close(self) -> None:
        """Stop the keeper (after one last try at the backlog) and drop the connections."""
        self._stop.set()
        if self._keeper is not None and self._keeper is not threading.current_thread():
            self._keeper.join(timeout=self.timeout_s + 1)
        self._flush()
        self._wire.close()

    def ping(self) -> bool:
        """True when Redis answers."""
        try:
            return bool(self._wire.call(command(b"PING")))
        except redis.RedisError:
            return False

    # -- internals ------------------------------------------------------------------------------------

    def _run_settle(self, lease: Lease, duration_ns: int, cost: float | None) -> bool:
        delta = b"" if cost is None else repr(float(cost) - lease.cost).encode()
        try:
            self._wire.run(_SETTLE, 5 + len(lease.keys),
                           self._keys_part(lease.keys) + bulk(_member(lease))
                           + bulk(b"%d" % max(0, int(duration_ns))) + bulk(delta) + bulk(repr(lease.cost).encode()))
        except redis.RedisError:
            return False
        return True

    def _run_release(self, lease: Lease) -> bool:
        try:
            self._wire.run(_RELEASE, 3 + len(lease.keys),
                           self._keys_part(lease.keys) + bulk(_member(lease)) + bulk(repr(lease.cost).encode()))
        except redis.RedisError:
            return False
        return True

    def _flush(self) -> None:
        with self._lock:
            backlog, self._backlog = self._backlog, []
        kept = []
        for op, lease, duration_ns, cost in backlog:
            done = self._run_settle(lease, duration_ns, cost) if op == "settle" else self._run_release(lease)
            if not done:
                kept.append((op, lease, duration_ns, cost))
        if kept:
            with self._lock:
                self._backlog[:0] = kept

    def _keep(self) -> None:
        """Renew this process's leases every third of a lease; retry failed settles and releases."""
        period = max(0.05, self.lease_s / 3)
        while not self._stop.wait(period):
            with self._lock:
                held = list(self._held.values())
            pairs = [(self._key(k) + ":l", _member(lease)) for lease in held for k in lease.keys]
            if pairs:
                tail = bulk(b"%d" % len(pairs)) + b"".join(bulk(z.encode()) for z, _ in pairs) + self._lease_ms
                try:
                    self._wire.run(_RENEW, 2 + 2 * len(pairs), tail + b"".join(bulk(m) for _, m in pairs))
                except redis.RedisError:
                    pass  # Redis is away: the leases run out there; a late settle counts the call again
            if self._backlog:
                self._flush()


def _member(lease: Lease) -> bytes:
    """The lease as its pools' lease sets hold it: id and reserved cost."""
    return (lease.id + "|" + repr(lease.cost)).encode()


def _clean(value: float) -> float:
    """Costs summed as floats in Redis, rounded back to what was added (9 decimals)."""
    return round(value, 9)

