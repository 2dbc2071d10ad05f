"""Shared budget ledgers: one process (`MemoryLedger`) or a fleet through Redis (`RedisLedger`)."""

from proctor.ledger.base import Claim, Lease, PoolUsage, SharedLedger
from proctor.ledger.memory import MemoryLedger
from proctor.ledger.opening import default_ledger, open_ledger
from proctor.ledger.scope import LedgerScope, ledger_scope

__all__ = ["Claim", "Lease", "LedgerScope", "MemoryLedger", "PoolUsage", "SharedLedger", "default_ledger",
           "ledger_scope", "open_ledger"]
