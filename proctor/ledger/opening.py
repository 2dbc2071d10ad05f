"""Which ledger a gate uses: one given, one a URL names (through `proctor.backends`), or the process's own."""

from __future__ import annotations

import os
import threading

from proctor.backends import resolve
from proctor.ledger.base import SharedLedger
from proctor.ledger.memory import MemoryLedger

__all__ = ["default_ledger", "open_ledger"]

_default: SharedLedger | None = None
_default_lock = threading.Lock()


def default_ledger() -> SharedLedger:
    """The process-wide in-memory ledger used when no ledger is given and PROCTOR_LEDGER is unset."""
    global _default
    with _default_lock:
        if _default is None:
            _default = MemoryLedger()
        return _default


def open_ledger(ledger: SharedLedger | str | None = None) -> SharedLedger:
    """A ledger from an object, a URL (`local` or `memory`, `redis://…`, `rediss://…`) or PROCTOR_LEDGER; else the
    process's default."""
    if ledger is None:
        ledger = os.environ.get("PROCTOR_LEDGER") or None
        if ledger is None:
            return default_ledger()
    if not isinstance(ledger, str):
        return ledger
    url = ledger.strip()
    if url in ("local", "memory", "memory://", ""):
        return default_ledger()
    return resolve("ledger", url)(url)
