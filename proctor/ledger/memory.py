"""`MemoryLedger`: the shared ledger of one process (the embedded default).

Pools live in a dict under one lock; leases expire on the monotonic clock, like the
Redis ledger's, so both pass the same conformance tests.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from proctor.errors import BudgetExceeded
from proctor.ledger.base import DEFAULT_LEASE_S, Claim, Lease, PoolUsage
from proctor.ledger.checks import refusal

__all__ = ["MemoryLedger"]


class MemoryLedger:
    """Budget pools shared by every run of this process (thread-safe)."""

    url = "memory"

    def __init__(self, *, lease_s: float = DEFAULT_LEASE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.lease_s = lease_s
        self._clock = clock
        self._lock = threading.Lock()
        self._pools: dict[str, PoolUsage] = {}
        # lease id -> (expiry, keys, cost)
        self._leases: dict[str, tuple[float, tuple[str, ...], float]] = {}
        self._ids = itertools.count(1)

    def _expire(self, now: float) -> None:
        dead = [i for i, (expiry, _, _) in self._leases.items() if expiry <= now]
        for lease_id in dead:
            _, keys, cost = self._leases.pop(lease_id)
            for key in keys:
                pool = self._pools[key]
                pool.calls -= 1
                pool.cost -= cost

    def reserve(self, claims: Sequence[Claim], cost: float, *, tool: str = "") -> Lease:
        with self._lock:
            now = self._clock()
            self._expire(now)
            for claim in claims:
                pool = self._pools.get(claim.key) or PoolUsage()
                problem = refusal(claim, pool.calls, pool.cost, pool.wall_ns, cost)
                if problem:
                    raise BudgetExceeded(f"{tool}: budget {problem}", tool=tool, budget=claim.budget)
            for claim in claims:
                pool = self._pools.setdefault(claim.key, PoolUsage())
                pool.calls += 1
                pool.cost += cost
            lease = Lease(f"m{next(self._ids)}", tuple(c.key for c in claims), cost)
            self._leases[lease.id] = (now + self.lease_s, lease.keys, cost)
            return lease

    def renew(self, leases: Sequence[Lease]) -> None:
        """Push back the expiry of live leases (the Redis ledger's keeper does this for its own)."""
        with self._lock:
            now = self._clock()
            for lease in leases:
                held = self._leases.get(lease.id)
                if held is not None:
                    self._leases[lease.id] = (now + self.lease_s, held[1], held[2])

    def settle(self, lease: Lease, *, duration_ns: int, cost: float | None = None) -> None:
        with self._lock:
            live = self._leases.pop(lease.id, None) is not None
            for key in lease.keys:
                pool = self._pools.setdefault(key, PoolUsage())
                if not live:  # expired and given back, yet it ran: count it again
                    pool.calls += 1
                    pool.cost += lease.cost
                pool.wall_ns += max(0, int(duration_ns))
                if cost is not None:
                    pool.cost += cost - lease.cost

    def release(self, lease: Lease) -> None:
        with self._lock:
            if self._leases.pop(lease.id, None) is None:
                return
            for key in lease.keys:
                pool = self._pools[key]
                pool.calls -= 1
                pool.cost -= lease.cost

    def charge(self, claims: Sequence[Claim], *, tokens: int, cost_usd: float) -> None:
        with self._lock:
            for claim in claims:
                pool = self._pools.setdefault(claim.key, PoolUsage())
                pool.model_tokens += tokens
                pool.model_cost_usd += cost_usd

    def usage(self, keys: Sequence[str]) -> Mapping[str, PoolUsage]:
        with self._lock:
            self._expire(self._clock())
            out = {}
            for key in keys:
                pool = self._pools.get(key) or PoolUsage()
                out[key] = PoolUsage(pool.calls, pool.cost, pool.wall_ns, pool.model_tokens, pool.model_cost_usd)
            return out

    def preload(self, key: str, usage: PoolUsage) -> None:
        """Set a pool's usage (what `policy test` cases and `explain --usage` start from)."""
        with self._lock:
            self._pools[key] = PoolUsage(usage.calls, usage.cost, usage.wall_ns, usage.model_tokens,
                                         usage.model_cost_usd)

    def close(self) -> None:
        """Nothing to stop."""
