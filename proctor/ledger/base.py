"""The shared budget ledger: pools of usage that many runs (and processes) draw on.

A per-run `proctor.policy.budgets.Ledger` counts `per: run` and `per: step` budgets
itself. Budgets shared between runs — `per: principal`, `per: label:KEY`, `per: global`
— are pools held by a `SharedLedger`, named by a `Claim` key: the budget, the scope's
value and the start of the budget's fixed window. Every implementation keeps the same
promises:

- `reserve` checks and counts one call (and its cost) against every claimed pool at
  once, atomically: all or nothing, and concurrent reservations — from threads or
  processes — never together pass a limit. It returns a `Lease`.
- A lease expires `lease_s` after it was taken (or last renewed) unless settled or
  released: a holder that died gives its reservation back instead of leaking it.
- `settle` keeps the call counted, adds its duration and corrects its cost; settling a
  lease that already expired counts the call again (it ran). `release` gives the call
  back. Each is idempotent per lease.
- An implementation that cannot reach its store raises `LedgerUnavailable` from
  `reserve` (fail closed); it never raises from `settle` or `release`, which it retries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["Claim", "Lease", "PoolUsage", "SharedLedger"]

#: How long a reservation is held without a sign of life from its holder.
DEFAULT_LEASE_S = 15.0


@dataclass(frozen=True, slots=True)
class Claim:
    """One pool a call counts against, with the budget's limits (None = no limit of that kind)."""

    key: str  # budget name, scope value and window start: "outbound|principal=alice|w=1764460800"
    budget: str
    calls: int | None = None
    cost: float | None = None
    wall_ns: int | None = None
    #: Seconds the pool must be kept (its window's length plus a margin); None keeps it.
    ttl_s: int | None = None
    #: The scope in words, for refusals: "for principal alice, window 24h".
    scope: str = ""


@dataclass(frozen=True, slots=True)
class Lease:
    """A reservation held in a shared ledger, awaiting `settle` or `release`."""

    id: str
    keys: tuple[str, ...]
    cost: float


@dataclass(slots=True)
class PoolUsage:
    """What one pool has used (reserved and settled calls alike)."""

    calls: int = 0
    cost: float = 0
    wall_ns: int = 0
    model_tokens: int = 0
    model_cost_usd: float = 0.0


@runtime_checkable
class SharedLedger(Protocol):
    """Pools of budget usage shared between runs; see the module docstring for the promises."""

    #: Where the pools live, for messages (`memory`, `redis://host:6379/0`).
    url: str

    def reserve(self, claims: Sequence[Claim], cost: float, *, tool: str = "") -> Lease:
        """Count one call against every claim, or raise BudgetExceeded (LedgerUnavailable when unreachable)."""
        ...

    def settle(self, lease: Lease, *, duration_ns: int, cost: float | None = None) -> None:
        """The call ran: keep it counted, add `duration_ns`; `cost` replaces the reserved cost."""
        ...

    def release(self, lease: Lease) -> None:
        """The call did not run: give back its call and cost."""
        ...

    def charge(self, claims: Sequence[Claim], *, tokens: int, cost_usd: float) -> None:
        """Add model usage to the claimed pools (no reservation: the model already answered)."""
        ...

    def usage(self, keys: Sequence[str]) -> Mapping[str, PoolUsage]:
        """What each pool has used (live leases included); raises LedgerUnavailable when unreachable."""
        ...

    def close(self) -> None:
        """Stop background work and drop connections."""
        ...


def _num(value: float) -> Any:
    return int(value) if float(value).is_integer() else value
