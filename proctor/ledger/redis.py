"""`RedisLedger`: budget pools shared by a fleet of processes, in one Redis.

Each operation is one Lua script — one round trip, atomic on the server:

- reserve: for every claimed pool, give back leases that have expired, check the
  limits, then count the call in all pools and record a lease (all or nothing);
- settle: end the lease, add the duration, correct the cost; a lease that had already
  expired was given back, so the call (which ran) is counted again — once: settling
  twice changes nothing;
- release: end the lease and give back its call and cost.

A pool is a hash at ``{prefix}b:<pool key>``: its counters (`calls`, `cost`, `wall_ns`,
`tok`, `usd`) and one field per live lease (name: the lease id, which has dots; value:
``<expiry ms>|<reserved cost>``, the expiry in Redis's own milliseconds, so hosts' clocks
do not matter). A reserve that fits runs TIME, HMGET and one HSET a pool; only when a
limit would refuse does it give back the pool's expired leases (until then they stay
counted, as if renewed: a reserve is never refused for them), keeping their ids a week in
``…:x`` for late settles. A keeper thread renews the leases this process holds, every
third of the lease, in one script call; a process that dies stops renewing, and its
reservations come back once expired. The scripts go out pre-encoded on the ledger's own
connections (`redis_wire`): one round trip each, with little of redis-py's per-command
work around it. A settle does not wait for its reply (settles repeat safely): the reply
is read with the next command on that connection, or by the keeper, and a settle whose
reply is an error or never comes is sent again by the keeper.

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
from typing import Literal

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from proctor.durations import parse_duration
from proctor.errors import BudgetExceeded, LedgerUnavailable
from proctor.ledger.base import DEFAULT_LEASE_S, Claim, Lease, PoolUsage
from proctor.ledger.checks import refusal
from proctor.ledger.redis_wire import Script, Wire, bulk, command
from proctor.urls import DEFAULT_NAMESPACE, redis_halts_url, shown_url, split_ledger_options

__all__ = ["RedisLedger"]

#: Claim sets (and key sets) whose encoding is kept; past this the cache starts again.
_CACHE = 1024

_NOW = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
"""

# A lease is a field of each of its pools' hashes: name = lease id (it has dots: counters do not),
# value = "<expiry ms>|<reserved cost>". A reserve that would pass a call or cost limit first gives
# back the pool's expired leases (`_PURGE`): their fields go, their calls and cost are subtracted,
# and their ids are kept a week in the pool's ``:x`` set, where a late settle finds them and counts
# the call again, once. A settle that finds its lease in neither place was already done (settles
# repeat safely). Until a limit needs the room, an expired lease stays counted, as if it had been
# renewed; a late settle of it then finds it in the hash and counts it once, as any settle.
_PURGE = """
local function purge(key, now)
  local all, x, gone, back = redis.call('HGETALL', key), key .. ':x', 0, 0
  for j = 1, #all, 2 do
    local f, v = all[j], all[j + 1]
    if string.find(f, '.', 1, true) then
      local bar = string.find(v, '|', 1, true)
      if tonumber(string.sub(v, 1, bar - 1)) <= now then
        gone, back = gone + 1, back + tonumber(string.sub(v, bar + 1))
        redis.call('HDEL', key, f)
        redis.call('ZADD', x, now, f)
      end
    end
  end
  if gone > 0 then
    redis.call('HINCRBY', key, 'calls', -gone)
    if back ~= 0 then redis.call('HINCRBYFLOAT', key, 'cost', -back) end
    redis.call('ZREMRANGEBYSCORE', x, '-inf', now - 604800000)
    redis.call('EXPIRE', x, 604800)
  end
  return gone, back
end
"""

# KEYS: pool hashes. ARGV: lease id, lease ms, cost, then 4 per pool: calls, cost, wall_ns limits ('' = none), ttl s.
# Returns 1, or {0, failing pool index (1-based), calls, cost, wall_ns}. On the way of a call that fits:
# TIME, one HMGET and one HSET per pool (and an EXPIRE when a pool with a ttl is made).
_RESERVE = Script(_NOW + _PURGE + """
local id, cost = ARGV[1], tonumber(ARGV[3])
local seen = {}
for i, key in ipairs(KEYS) do
  local u = redis.call('HMGET', key, 'calls', 'cost', 'wall_ns')
  local calls, used, wall = tonumber(u[1] or 0), tonumber(u[2] or 0), tonumber(u[3] or 0)
  local b = i * 4
  local lc, lcost, lwall = tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  if (lc and calls + 1 > lc) or (lcost and used + cost > lcost + 1e-9) then
    local gone, back = purge(key, now)
    calls, used = calls - gone, used - back
  end
  if (lc and calls + 1 > lc) or (lcost and used + cost > lcost + 1e-9) or (lwall and wall >= lwall) then
    return {0, i, tostring(calls), tostring(used), tostring(wall)}
  end
  seen[i] = {calls + 1, used + cost, u[1]}
end
local lease = (now + tonumber(ARGV[2])) .. '|' .. ARGV[3]
for i, key in ipairs(KEYS) do
  local s = seen[i]
  if cost ~= 0 then
    redis.call('HSET', key, 'calls', s[1], 'cost', string.format('%.17g', s[2]), id, lease)
  else
    redis.call('HSET', key, 'calls', s[1], id, lease)
  end
  local ttl = ARGV[i * 4 + 3]
  if ttl ~= '' and not s[3] then redis.call('EXPIRE', key, ttl) end
end
return 1
""")

# KEYS: pool hashes. ARGV: lease id, duration ns, cost delta ('' = none), reserved cost. Returns 1 when late.
_SETTLE = Script("""
local id, dur, delta, reserved = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local late = 0
for _, key in ipairs(KEYS) do
  local held = redis.call('HDEL', key, id) == 1
  if not held and redis.call('ZREM', key .. ':x', id) == 1 then
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

# KEYS: pool hashes. ARGV: lease id, reserved cost.
_RELEASE = Script("""
local cost = tonumber(ARGV[2])
for _, key in ipairs(KEYS) do
  if redis.call('HDEL', key, ARGV[1]) == 1 then
    redis.call('HINCRBY', key, 'calls', -1)
    if cost ~= 0 then redis.call('HINCRBYFLOAT', key, 'cost', -cost) end
  end
end
return 1
""")

# KEYS: the pool hashes of (pool, lease) pairs. ARGV: lease ms, then per key: lease id, reserved cost.
_RENEW = Script(_NOW + """
local expiry = now + tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  local id = ARGV[i * 2]
  if redis.call('HEXISTS', key, id) == 1 then redis.call('HSET', key, id, expiry .. '|' .. ARGV[i * 2 + 1]) end
end
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

# KEYS: pool hashes. Returns, per pool, {calls, cost, wall_ns, tok, usd} with expired leases' counts left out
# (read-only: a reserve that needs their room gives them back).
_USAGE = Script(_NOW + """
local out = {}
for i, key in ipairs(KEYS) do
  local all, h, calls, cost = redis.call('HGETALL', key), {}, 0, 0
  for j = 1, #all, 2 do
    local f, v = all[j], all[j + 1]
    if string.find(f, '.', 1, true) then
      local bar = string.find(v, '|', 1, true)
      if tonumber(string.sub(v, 1, bar - 1)) <= now then
        calls, cost = calls - 1, cost - tonumber(string.sub(v, bar + 1))
      end
    else
      h[f] = v
    end
  end
  out[i] = {tostring(calls + (tonumber(h.calls) or 0)), tostring(cost + (tonumber(h.cost) or 0)),
            h.wall_ns or '0', h.tok or '0', h.usd or '0'}
end
return out
""")


#: Every RedisLedger of this process, so that a forked child drops its parent's leases (at fork, not per call).
_LEDGERS: weakref.WeakSet[RedisLedger] = weakref.WeakSet()


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
        target, options = split_ledger_options(url)
        self.url = shown_url(url, query=False)
        self.lease_s = lease_s if lease_s is not None else (
            parse_duration(options["lease"]) if "lease" in options else DEFAULT_LEASE_S)
        self.timeout_s = timeout_s if timeout_s is not None else (
            parse_duration(options["timeout"]) if "timeout" in options else 2.0)
        # The hash tag keeps every key in one Redis Cluster slot, so each script may touch them all.
        namespace = prefix or options.get("prefix") or DEFAULT_NAMESPACE
        self.prefix = "{" + namespace + "}:"
        self._halts_url = redis_halts_url(target, namespace)  # a fleet's own prefix keeps its own halts
        self._wire = Wire(redis.ConnectionPool.from_url(
            target, socket_timeout=self.timeout_s, socket_connect_timeout=self.timeout_s,
            retry=Retry(NoBackoff(), 0), retry_on_timeout=False, health_check_interval=0,
            protocol=2,  # RESP2: no push message can come between a command and its reply
        ), lost=self._lost)
        self._lease_ms = bulk(b"%d" % int(self.lease_s * 1000))
        self._fixed: dict[tuple[Claim, ...], tuple[int, tuple[str, ...], bytes, bytes]] = {}
        self._keys: dict[tuple[str, ...], bytes] = {}
        self._ids = itertools.count(1)
        self._id_prefix = _id_prefix()
        self._lock = threading.Lock()
        self._held: dict[str, Lease] = {}
        self._backlog: list[tuple[str, Lease, int, float | None]] = []  # (op, lease, duration_ns, cost)
        self._stop = threading.Event()
        self._wake = threading.Event()  # the keeper's: a round now (settles to send again), or stop
        self._keeper: threading.Thread | None = None
        self._settle_loaded = False  # until one settle ran, Redis may lack its script: wait for that reply
        weakref.finalize(self, _stop_keeper, self._stop, self._wake)
        _LEDGERS.add(self)

    def __repr__(self) -> str:
        return f"RedisLedger({self.url!r}, lease_s={self.lease_s:g})"

    @property
    def halts_at(self) -> tuple[Literal["redis"], str]:
        """Where `proctor halt --ledger URL` keeps the halts of the fleet sharing this ledger: a gate on this ledger
        honours them (`proctor.halt.SharesHalts`)."""
        return ("redis", self._halts_url)

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

    def _fixed_part(self, claims: tuple[Claim, ...]) -> tuple[int, tuple[str, ...], bytes, bytes]:
        """For a reserve of `claims`: how many RESP strings follow the sha, the pools' names, keys, limits."""
        if len(self._fixed) >= _CACHE:
            self._fixed.clear()
        limits = b"".join(
            bulk(b"" if c.calls is None else b"%d" % c.calls)
            + bulk(b"" if c.cost is None else repr(float(c.cost)).encode())
            + bulk(b"" if c.wall_ns is None else b"%d" % c.wall_ns)
            + bulk(b"" if c.ttl_s is None else b"%d" % c.ttl_s)
            for c in claims)
        names = tuple(c.key for c in claims)
        # After EVALSHA and the sha: numkeys, the keys, id, lease ms, cost, 4 limits a pool.
        fixed = self._fixed[claims] = (4 + 5 * len(claims), names, self._keys_part(names), limits)
        return fixed

    @staticmethod
    def _reset_after_fork() -> None:
        for ledger in list(_LEDGERS):
            RedisLedger._forked(ledger)

    # Once per process, when the class is made (at fork, not per call); a staticmethod is callable here.
    os.register_at_fork(after_in_child=_reset_after_fork)

    def _forked(self) -> None:
        """In a forked child: none of the parent's leases, backlog, keeper or lease ids are this process's."""
        self._held, self._backlog = {}, []
        self._lock = threading.Lock()
        self._id_prefix = _id_prefix()
        self._keeper = None

    def _start_keeper(self) -> None:
        with self._lock:
            if self._keeper is None:
                self._keeper = threading.Thread(target=self._keep, name="proctor-ledger-keeper", daemon=True)
                self._keeper.start()

    # -- the protocol ---------------------------------------------------------------------------------

    def reserve(self, claims: Sequence[Claim], cost: float, *, tool: str = "") -> Lease:
        """Count one call against every claimed pool in one script, or raise BudgetExceeded/LedgerUnavailable."""
        if self._keeper is None:
            self._start_keeper()
        claims = tuple(claims)
        count, names, keys, limits = self._fixed.get(claims) or self._fixed_part(claims)
        lease = Lease(self._id_prefix + str(next(self._ids)), names, float(cost))
        ident, amount = lease.id.encode(), repr(lease.cost).encode()
        try:
            result = self._wire.run(_RESERVE, count, b"%b$%d\r\n%b\r\n%b$%d\r\n%b\r\n%b" % (
                keys, len(ident), ident, self._lease_ms, len(amount), amount, limits))
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
        """End the lease, keep the call counted, add its duration; retried by the keeper if Redis is away.

        The script is written without waiting for its reply (a settle repeats safely): the reply is
        read by the next command on that connection or by the keeper, and a settle whose reply is an
        error or lost goes to the keeper's backlog, which sends it again.
        """
        with self._lock:
            self._held.pop(lease.id, None)
        note = ("settle", lease, duration_ns, cost)
        try:
            if self._settle_loaded:
                self._wire.send(_SETTLE, 5 + len(lease.keys), self._settle_tail(lease, duration_ns, cost), note)
            else:
                self._wire.run(_SETTLE, 5 + len(lease.keys), self._settle_tail(lease, duration_ns, cost))
                self._settle_loaded = True
        except redis.RedisError:
            self._lost([note])

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
        _stop_keeper(self._stop, self._wake)
        if self._keeper is not None and self._keeper is not threading.current_thread():
            self._keeper.join(timeout=self.timeout_s + 1)
        self._wire.drain()  # the replies of settles sent: the lost ones join the backlog
        self._flush()
        self._wire.close()

    def ping(self) -> bool:
        """True when Redis answers."""
        try:
            return bool(self._wire.call(command(b"PING")))
        except redis.RedisError:
            return False

    # -- internals ------------------------------------------------------------------------------------

    def _settle_tail(self, lease: Lease, duration_ns: int, cost: float | None) -> bytes:
        delta = b"" if cost is None else repr(float(cost) - lease.cost).encode()
        ident, dur, amount = lease.id.encode(), b"%d" % max(0, int(duration_ns)), repr(lease.cost).encode()
        return self._keys_part(lease.keys) + b"$%d\r\n%b\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n" % (
            len(ident), ident, len(dur), dur, len(delta), delta, len(amount), amount)

    def _run_settle(self, lease: Lease, duration_ns: int, cost: float | None) -> bool:
        try:
            self._wire.run(_SETTLE, 5 + len(lease.keys), self._settle_tail(lease, duration_ns, cost))
        except redis.RedisError:
            return False
        return True

    def _lost(self, notes: list[tuple[str, Lease, int, float | None]]) -> None:
        """Settles whose replies were errors or never came: the keeper sends them again, now."""
        with self._lock:
            self._backlog.extend(notes)
        self._wake.set()
        if self._keeper is None:
            self._start_keeper()

    def _run_release(self, lease: Lease) -> bool:
        try:
            self._wire.run(_RELEASE, 3 + len(lease.keys),
                           self._keys_part(lease.keys) + bulk(lease.id.encode()) + bulk(repr(lease.cost).encode()))
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
        while True:
            self._wake.wait(period)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._wire.drain()
                self._renew()
                if self._backlog:
                    self._flush()
            except Exception as exc:  # noqa: BLE001 - the keeper must outlive one failure; the next round retries
                from proctor.telemetry.logging import get_logger

                get_logger("proctor.ledger").error("ledger_keeper_failed", url=self.url, error=repr(exc))

    def _renew(self) -> None:
        with self._lock:
            held = list(self._held.values())
        pairs = [(self._key(k).encode(), lease) for lease in held for k in lease.keys]
        if not pairs:
            return
        tail = bulk(b"%d" % len(pairs)) + b"".join(bulk(key) for key, _ in pairs) + self._lease_ms + b"".join(
            bulk(lease.id.encode()) + bulk(repr(lease.cost).encode()) for _, lease in pairs)
        try:
            self._wire.run(_RENEW, 2 + 3 * len(pairs), tail)
        except redis.RedisError:
            pass  # Redis is away: the leases run out there; a late settle counts the call again


def _stop_keeper(stop: threading.Event, wake: threading.Event) -> None:
    stop.set()
    wake.set()


def _id_prefix() -> str:
    """The start of this process's lease ids: pid and 32 random bits, with dots (pool counters have none)."""
    return f"{os.getpid():x}.{os.urandom(4).hex()}."


def _clean(value: float) -> float:
    """Costs summed as floats in Redis, rounded back to what was added (9 decimals)."""
    return round(value, 9)
