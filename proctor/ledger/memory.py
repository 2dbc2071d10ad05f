"""`MemoryLedger`: the shared ledger of one process (the embedded default).

Pools live in a dict under one lock. Its leases never expire: their holders are threads
of this process, and when the process dies its pools die with it.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping, Sequence

from proctor.errors import BudgetExceeded
from proctor.ledger.base import Claim, Lease, PoolUsage
from proctor.ledger.checks import refusal

__all__ = ["MemoryLedger"]


class MemoryLedger:
    """Budget pools shared by every run of this process (thread-safe)."""

    url = "memory"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pools: dict[str, PoolUsage] = {}
        self._leases: dict[str, Lease] = {}
        self._ids = itertools.count(1)

    def reserve(self, claims: Sequence[Claim], cost: float, *, tool: str = "") -> Lease:
        with self._lock:
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
            self._leases[lease.id] = lease
            return lease

    def settle(self, lease: Lease, *, duration_ns: int, cost: float | None = None) -> None:
        with self._lock:
            if self._leases.pop(lease.id, None) is None:  # settled or released already (leases never expire here)
                return
            for key in lease.keys:
                pool = self._pools[key]
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
