"""The policy engine: load a YAML policy (schema, loader), decide calls (engine, conditions), count budgets.

Parse, validate and evaluate are separate steps with their own errors: YAML and
schema problems are `PolicyError`s with file, line and column; a condition that fails
while deciding is a deny naming the rule; a budget limit is a `BudgetExceeded`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import proctor._lazy as _lazy

if TYPE_CHECKING:
    from proctor.policy.budgets import Ledger, Reservation
    from proctor.policy.engine import ApprovalSettings, Policy, ToolFacts

__all__ = ["ApprovalSettings", "Ledger", "Policy", "Reservation", "ToolFacts"]

_lazy.install(__name__, {
    "Ledger": "proctor.policy.budgets",
    "Reservation": "proctor.policy.budgets",
    "ApprovalSettings": "proctor.policy.engine",
    "Policy": "proctor.policy.engine",
    "ToolFacts": "proctor.policy.engine",
})
