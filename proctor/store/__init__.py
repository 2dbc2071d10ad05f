"""Durable runs: the run store, its journal of call results, and approvals answered from anywhere.

`RunStore.open(url)` opens one (``sqlite:///runs.db`` embedded, ``postgresql://…``
for fleets); see `proctor.store.base` for what a store keeps and promises.
"""

from __future__ import annotations

from proctor.store.base import (
    APPROVAL_STATES,
    RUN_STATES,
    ApprovalAnswer,
    ApprovalState,
    JournalEntry,
    PendingApproval,
    RunRecord,
    RunState,
    RunStore,
    register_scheme,
)

__all__ = [
    "APPROVAL_STATES",
    "RUN_STATES",
    "ApprovalAnswer",
    "ApprovalState",
    "JournalEntry",
    "PendingApproval",
    "RunRecord",
    "RunState",
    "RunStore",
    "register_scheme",
]
