"""A run's budgets under a policy that is reloaded while the run goes on.

A reloaded policy decides a run's next call whole (`Gate.policy_for`): its rules and its budgets.
So a run of a reloading gate counts its calls on a `FollowingLedger`: the ledger of the policy that
decides the call about to be reserved, made anew from the run's usage when that policy changes
(`follow`, before the call is decided). Budgets the new policy keeps (by name) carry their use
over, whatever their new limits; budgets it adds count from the change on; budgets it drops are
gone. A hold is given back to the ledger that made it, so a call in flight across a reload is
settled where it was counted (its duration and settled cost are not added to the new ledger's).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from proctor.calls import BudgetFigures, BudgetHold, JSONValue, RunInfo, SideEffect

if TYPE_CHECKING:
    from proctor.gate.run import Ledger
    from proctor.ledger.base import SharedLedger

__all__ = ["FollowingLedger", "LedgerPolicy"]


class LedgerPolicy(Protocol):
    """What a following ledger needs of a policy: its fingerprint, and a ledger of its budgets for a run."""

    @property
    def sha256(self) -> str: ...
    def new_ledger(self, run: RunInfo | None = None, shared: SharedLedger | None = None) -> Ledger: ...


class _Held(BudgetHold):
    """A hold made by one of the ledgers a `FollowingLedger` followed, and that ledger."""

    __slots__ = ("hold", "ledger")

    def __init__(self, hold: BudgetHold, ledger: Ledger) -> None:
        self.hold, self.ledger = hold, ledger


class FollowingLedger:
    """The budgets of one run, as the policy that decides its next call has them (see the module docstring).
    A `proctor.gate.run.Ledger`: `tests/test_run_ledger.py` holds it to every promise there."""

    def __init__(self, policy: LedgerPolicy, run: RunInfo, shared: SharedLedger | None) -> None:
        self._run, self._shared = run, shared
        self._sha256 = policy.sha256
        self._current: Ledger = policy.new_ledger(run, shared)
        self._lock = threading.Lock()

    def follow(self, policy: LedgerPolicy) -> None:
        """Count from now on with `policy`'s budgets, carrying the run's use over (no change for the same one)."""
        if policy.sha256 == self._sha256:
            return
        with self._lock:
            if policy.sha256 == self._sha256:
                return
            fresh = policy.new_ledger(self._run, self._shared)
            fresh.restore(self._current.snapshot())
            self._current, self._sha256 = fresh, policy.sha256

    # -- proctor.gate.run.Ledger ----------------------------------------------------------------

    def reserve(self, tool: str, side_effect: SideEffect, cost: float) -> BudgetHold:
        # Under the lock `follow` takes: a call reserved on the old ledger after its snapshot was taken would be
        # missing from the new one. (A run's calls rarely overlap; a shared pool's network hop then waits here.)
        with self._lock:
            ledger = self._current
            return _Held(ledger.reserve(tool, side_effect, cost), ledger)

    def settle(self, hold: BudgetHold, *, duration_ns: int, cost: float | None = None) -> None:
        held = _Held.given_back(hold, "FollowingLedger")
        held.ledger.settle(held.hold, duration_ns=duration_ns, cost=cost)

    def release(self, hold: BudgetHold) -> None:
        held = _Held.given_back(hold, "FollowingLedger")
        held.ledger.release(held.hold)

    def spend(self, hold: BudgetHold) -> dict[str, BudgetFigures]:
        held = _Held.given_back(hold, "FollowingLedger")
        return held.ledger.spend(held.hold)

    def usage(self) -> dict[str, BudgetFigures]:
        return self._current.usage()

    def remaining(self) -> dict[str, BudgetFigures]:
        return self._current.remaining()

    def next_step(self) -> None:
        self._current.next_step()

    def replay(self, tool: str, side_effect: SideEffect, cost: float, duration_ns: int) -> None:
        self._current.replay(tool, side_effect, cost, duration_ns)

    def snapshot(self) -> dict[str, JSONValue]:
        return self._current.snapshot()

    def restore(self, snapshot: Mapping[str, JSONValue]) -> None:
        self._current.restore(snapshot)

    def charge_model(self, tokens: int, cost_usd: float, *, shared: bool = True) -> None:
        self._current.charge_model(tokens, cost_usd, shared=shared)

    def check_model(self) -> None:
        self._current.check_model()
