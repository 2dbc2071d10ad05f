"""What every SharedLedger must do, run against the in-memory and the Redis ledger alike.

A subclass provides one fixture, `make_ledger(lease_s)`, returning a fresh ledger whose
pools are empty (all ledgers it returns within a test share the same store).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from proctor.errors import BudgetExceeded
from proctor.ledger import Claim, SharedLedger

MakeLedger = Callable[[float], SharedLedger]


def _claim(key: str = "b|global|w=0", calls: int | None = 3, cost: float | None = None) -> Claim:
    return Claim(key=key, budget=key.split("|")[0], calls=calls, cost=cost, scope="for all runs")


class LedgerConformance:
    """The SharedLedger promises (proctor/ledger/base.py)."""

    def test_reserve_refuses_past_the_call_limit(self, make_ledger: MakeLedger) -> None:
        """Three calls fit a limit of 3; the fourth is refused naming budget and scope."""
        led = make_ledger(30)
        for _ in range(3):
            led.reserve([_claim()], 0, tool="t")
        with pytest.raises(BudgetExceeded, match="t: budget 'b' exhausted for all runs: 3 of 3 calls used") as e:
            led.reserve([_claim()], 0, tool="t")
        assert e.value.budget == "b"

    def test_reserve_is_all_or_nothing_across_pools(self, make_ledger: MakeLedger) -> None:
        """A call refused by its second pool is not counted in its first."""
        led = make_ledger(30)
        a, b = _claim("a|global|w=0", calls=5), _claim("b|global|w=0", calls=1)
        led.reserve([a, b], 0)
        with pytest.raises(BudgetExceeded):
            led.reserve([a, b], 0)
        assert led.usage([a.key])[a.key].calls == 1

    def test_cost_is_reserved_then_corrected_by_settle(self, make_ledger: MakeLedger) -> None:
        """Cost counts at reserve; settle replaces it by the actual cost and adds the duration."""
        led = make_ledger(30)
        c = _claim(calls=None, cost=10)
        lease = led.reserve([c], 8)
        with pytest.raises(BudgetExceeded, match="cost 8 used"):
            led.reserve([c], 3)
        led.settle(lease, duration_ns=5_000_000, cost=2)
        led.reserve([c], 8)
        used = led.usage([c.key])[c.key]
        assert (used.calls, used.cost, used.wall_ns) == (2, 10, 5_000_000)

    def test_settling_twice_counts_once(self, make_ledger: MakeLedger) -> None:
        """A settle repeated (a retry after a lost reply) changes nothing the first one did not."""
        led = make_ledger(30)
        c = _claim(calls=None, cost=10)
        lease = led.reserve([c], 4)
        led.settle(lease, duration_ns=7, cost=3)
        led.settle(lease, duration_ns=7, cost=3)
        used = led.usage([c.key])[c.key]
        assert (used.calls, used.cost, used.wall_ns) == (1, 3, 7)

    def test_release_gives_back_once(self, make_ledger: MakeLedger) -> None:
        """A released lease returns its call; releasing it again changes nothing."""
        led = make_ledger(30)
        lease = led.reserve([_claim(calls=1)], 0)
        led.release(lease)
        led.release(lease)
        led.reserve([_claim(calls=1)], 0)
        assert led.usage([_claim().key])[_claim().key].calls == 1

    def test_model_charges_add_up(self, make_ledger: MakeLedger) -> None:
        """charge adds tokens and dollars to each claimed pool."""
        led = make_ledger(30)
        c = _claim(calls=None)
        led.charge([c], tokens=10, cost_usd=0.25)
        led.charge([c], tokens=5, cost_usd=0.5)
        used = led.usage([c.key])[c.key]
        assert (used.model_tokens, used.model_cost_usd) == (15, 0.75)

    def test_concurrent_reservations_never_overshoot(self, make_ledger: MakeLedger) -> None:
        """8 threads racing for a limit of 50 get exactly 50 reservations."""
        led = make_ledger(30)
        got: list[int] = []

        def race() -> None:
            n = 0
            for _ in range(20):
                try:
                    led.reserve([_claim(calls=50)], 0)
                    n += 1
                except BudgetExceeded:
                    pass
            got.append(n)

        threads = [threading.Thread(target=race) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(got) == 50


class LeaseConformance:
    """Leases, for ledgers shared between processes (a holder may die)."""

    def test_an_unrenewed_lease_expires_and_a_late_settle_counts_again(self, make_ledger: MakeLedger) -> None:
        """A lease nobody settles comes back after lease_s; settling it afterwards counts the call that ran."""
        holder = make_ledger(0.3)
        lease = holder.reserve([_claim(calls=1)], 0)
        holder.close()  # stops renewing, as a dead process would
        other = make_ledger(30)
        deadline = time.monotonic() + 10
        while True:
            try:
                other.reserve([_claim(calls=1)], 0)
                break
            except BudgetExceeded:
                assert time.monotonic() < deadline, "the dead holder's lease never expired"
                time.sleep(0.05)
        other.settle(lease, duration_ns=1)
        assert other.usage([_claim().key])[_claim().key].calls == 2
        other.settle(lease, duration_ns=1)  # a retried late settle counts the call once
        assert other.usage([_claim().key])[_claim().key].calls == 2

    def test_a_live_holder_keeps_its_lease(self, make_ledger: MakeLedger) -> None:
        """A holder that is alive keeps its reservation past lease_s (it renews it)."""
        holder = make_ledger(0.3)
        holder.reserve([_claim(calls=1)], 0)
        time.sleep(1.2)
        with pytest.raises(BudgetExceeded):
            make_ledger(30).reserve([_claim(calls=1)], 0)
