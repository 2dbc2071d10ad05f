"""Where a policy's cross-run budgets are counted, checked before a gate starts.

A budget ``per: principal``, ``per: label:KEY`` or ``per: global`` means "across runs";
ops who write one for a fleet mean across processes too. The process-local ledger
(`MemoryLedger`, what a gate gets when it is given none and ``PROCTOR_LEDGER`` is unset)
counts only the runs of its own process: five processes would each allow the whole
budget. So such a policy starts a gate only on a shared ledger (Redis), unless a
process-local one is meant and said so, by the policy (``ledger: local``) or by whoever
built the gate (``Gate(..., ledger="local")``, ``PROCTOR_LEDGER=local``, or a
`MemoryLedger` handed over). What was meant is then stated where a run is read
afterwards: the run summary and the audit log's ``run_started`` record.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from proctor.errors import ConfigurationError
from proctor.ledger.base import SharedLedger
from proctor.ledger.memory import MemoryLedger

__all__ = ["LOCAL_NAMES", "BudgetScopes", "LedgerScope", "ScopedBudget", "ledger_scope"]

#: Ledger names that mean "this process's own ledger" (`Gate(ledger=…)`, PROCTOR_LEDGER, --ledger).
LOCAL_NAMES = ("local", "memory", "memory://")


class ScopedBudget(Protocol):
    """What the check reads of a budget (`proctor.policy.schema.BudgetSpec` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def per(self) -> str: ...
    @property
    def window(self) -> float | None: ...
    @property
    def shared(self) -> bool: ...


class BudgetScopes(Protocol):
    """What the check reads of a policy file (`proctor.policy.schema.PolicyModel` is one)."""

    @property
    def budgets(self) -> Sequence[ScopedBudget]: ...
    @property
    def ledger(self) -> str: ...


@dataclass(frozen=True)
class LedgerScope:
    """Where one gate counts its policy's cross-run budgets.

    `budgets` maps each cross-run budget to its scope in words (``global, window 1h``); `local` is
    True when they are counted by this process alone (meant, or the gate would not have started).
    """

    url: str
    local: bool
    budgets: Mapping[str, str] = field(default_factory=dict)

    @property
    def audit_fields(self) -> dict[str, Any]:
        """Fields of the `run_started` record: set only when cross-run budgets are counted by this process."""
        if not (self.local and self.budgets):
            return {}
        return {"ledger": "local", "ledger_budgets": dict(self.budgets)}

    @property
    def summary(self) -> str | None:
        """The run summary's ``ledger`` row, or None when the policy has no cross-run budget."""
        if not self.budgets:
            return None
        listed = "; ".join(f"{name} (per {scope})" for name, scope in self.budgets.items())
        if self.local:
            return f"local: this process only, each process counts on its own: {listed}"
        return f"{self.url} (shared): {listed}"


def _scope(budget: ScopedBudget) -> str:
    return budget.per + (f", window {budget.window:g}s" if budget.window is not None else "")


def _said_local(requested: SharedLedger | str | None) -> bool:
    """Whether whoever built the gate named a process-local ledger (not merely left it unset)."""
    if requested is None:
        requested = os.environ.get("PROCTOR_LEDGER") or None
    if isinstance(requested, str):
        return requested.strip() in LOCAL_NAMES
    return isinstance(requested, MemoryLedger)


def ledger_scope(policy: BudgetScopes, ledger: SharedLedger, requested: SharedLedger | str | None) -> LedgerScope:
    """Check that `policy`'s cross-run budgets may be counted on `ledger` (opened from `requested`, what
    the gate was given); raise `ConfigurationError` with the fix, in one line, when they may not.

    A budget wider than a run on a process-local ledger is refused unless the policy says
    ``ledger: local`` or `requested` names a local ledger itself (`LOCAL_NAMES`, a `MemoryLedger`).
    """
    wide = {b.name: _scope(b) for b in policy.budgets if b.shared}
    local = isinstance(ledger, MemoryLedger)
    if wide and local and policy.ledger != "local" and not _said_local(requested):
        named = ", ".join(f"'{name}' (per {scope})" for name, scope in wide.items())
        raise ConfigurationError(
            f"budget{'s' if len(wide) > 1 else ''} {named} count{'' if len(wide) > 1 else 's'} across runs, but this "
            "gate's ledger is process-local (each process would count on its own): set "
            "PROCTOR_LEDGER=redis://host:6379/0 or Gate(..., ledger='redis://host:6379/0'); "
            "or write `ledger: local` in the policy if this one process is meant")
    return LedgerScope(url=ledger.url, local=local, budgets=wide)
