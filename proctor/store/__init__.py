"""Durable runs: the run store, its journal of call results, and approvals answered from anywhere.

`RunStore.open(url)` opens one (``sqlite:///runs.db`` embedded, ``postgresql://…``
for fleets); see `proctor.store.base` for what a store keeps and promises.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import proctor._lazy as _lazy

if TYPE_CHECKING:
    from proctor.store.answerseal import AnswerSeal
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
    "AnswerSeal",
    "ApprovalAnswer",
    "ApprovalState",
    "JournalEntry",
    "PendingApproval",
    "RunRecord",
    "RunState",
    "RunStore",
    "register_scheme",
]

_lazy.install(__name__, {
    "APPROVAL_STATES": "proctor.store.base",
    "RUN_STATES": "proctor.store.base",
    "AnswerSeal": "proctor.store.answerseal",
    "ApprovalAnswer": "proctor.store.base",
    "ApprovalState": "proctor.store.base",
    "JournalEntry": "proctor.store.base",
    "PendingApproval": "proctor.store.base",
    "RunRecord": "proctor.store.base",
    "RunState": "proctor.store.base",
    "RunStore": "proctor.store.base",
    "register_scheme": "proctor.store.base",
})
