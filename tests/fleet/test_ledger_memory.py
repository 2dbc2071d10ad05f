"""The in-memory ledger passes the SharedLedger conformance suite."""

from __future__ import annotations

import pytest
from ledger_conformance import LedgerConformance, MakeLedger

from proctor.ledger import MemoryLedger, SharedLedger


@pytest.fixture
def make_ledger() -> MakeLedger:
    """One MemoryLedger per test, whatever lease is asked for (its leases never expire)."""
    led = MemoryLedger()

    def make(lease_s: float) -> SharedLedger:
        return led

    return make


class TestMemoryLedger(LedgerConformance):
    """MemoryLedger keeps every promise of the protocol."""
