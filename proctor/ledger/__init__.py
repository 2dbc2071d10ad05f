"""Shared budget ledgers: one process (`MemoryLedger`) or a fleet through Redis (`RedisLedger`)."""

from proctor.ledger.base import Claim, Lease, PoolUsage, SharedLedger, default_ledger, open_ledger
from proctor.ledger.memory import MemoryLedger

__all__ = ["Claim", "Lease", "MemoryLedger", "PoolUsage", "SharedLedger", "default_ledger", "open_ledger"]
