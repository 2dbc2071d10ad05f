"""A run: who runs it, its budget ledger, the history of its calls and the grants given in it.

The gate keeps one `RunContext` per run; conditions see its history as `history`
and its budget usage as `usage`, both read without copying.
"""

from __future__ import annotations

import fnmatch
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol, overload

from proctor.approval.base import Grant
from proctor.calls import CallRecord, CallStatus, HistoryEntry, Outcome, RunInfo, SideEffect

__all__ = ["LazyUsage", "Ledger", "RunContext"]


class Ledger(Protocol):
    """What a run needs of a budget ledger; `proctor.policy.budgets.Ledger` is one."""

    def reserve(self, tool: str, side_effect: SideEffect, cost: float) -> Any: ...
    def settle(self, reservation: Any, *, duration_ns: int, cost: float | None = None) -> None: ...
    def release(self, reservation: Any) -> None: ...
    def usage(self) -> dict[str, dict[str, Any]]: ...
    def remaining(self) -> dict[str, dict[str, Any]]: ...
    def next_step(self) -> None: ...


class RunContext:
    """One run: who runs it, its budgets, its call history and the grants given during it."""

    def __init__(self, info: RunInfo, ledger: Ledger) -> None:
        self._lock = threading.Lock()
        self.info = info
        self.ledger = ledger
        # The history as plain rows: a tuple is built in a fifth of a frozen HistoryEntry's time,
        # and most calls are decided without anyone reading the history.
        self._rows: list[_Row] = []
        self.records: list[CallRecord] = []
        self.grants: list[Grant] = []
        # Labels of the tools whose calls ran (`seen` in conditions): kept as calls happen, never rebuilt.
        self._seen: set[str] = set()
        self._seen_sorted: tuple[str, ...] = ()

    def next_step(self) -> int:
        """Start the next step of the run (resets `per: step` budgets); return its number."""
        with self._lock:
            self.info = replace(self.info, step=self.info.step + 1)
            self.ledger.next_step()
            return self.info.step

    @property
    def history(self) -> list[HistoryEntry]:
        """The calls so far, oldest first."""
        return list(self.history_view())

    def history_view(self) -> Sequence[HistoryEntry]:
        """The calls so far, as an O(1) read-only snapshot (the history is append-only)."""
        return _HistoryView(self._rows, len(self._rows))

    def seen_labels(self) -> tuple[str, ...]:
        """The labels of the tools whose calls ran in this run so far, sorted (`seen` in conditions)."""
        return self._seen_sorted

    def _remember(self, entry: HistoryEntry, record: CallRecord) -> None:
        self._remember_row(entry.tool, entry.args, entry.side_effect, entry.decision, entry.status, record,
                           labels=entry.labels)

    def _remember_row(self, tool: str, args: Mapping[str, Any], side_effect: SideEffect, decision: Outcome,
                      status: CallStatus, record: CallRecord, labels: tuple[str, ...] = ()) -> None:
        # No lock: both lists only ever grow, and append and len are atomic, so a snapshot
        # taken by another thread sees a prefix of each.
        self._rows.append((tool, args, side_effect, decision, status, labels))
        self.records.append(record)
        if labels and status in _RAN and not self._seen.issuperset(labels):
            with self._lock:
                self._seen.update(labels)
                self._seen_sorted = tuple(sorted(self._seen))

    def _granted(self, tool: str, args: Mapping[str, Any]) -> Grant | None:
        with self._lock:
            for grant in self.grants:
                if grant.tool == tool and all(
                    name in args and fnmatch.fnmatchcase(str(args[name]), pattern)
                    for name, pattern in grant.args.items()
                ):
                    return grant
        return None


#: Statuses of a call whose tool started: its labels join the run's `seen`.
_RAN = frozenset(("ok", "failed", "timeout", "unknown"))

_Row = tuple[str, Mapping[str, Any], SideEffect, Outcome, CallStatus, tuple[str, ...]]


class _HistoryView(Sequence[HistoryEntry]):
    """The first `n` rows of an append-only list, as entries, without copying it."""

    __slots__ = ("_items", "_n")

    def __init__(self, items: list[_Row], n: int) -> None:
        self._items, self._n = items, n

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> HistoryEntry: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[HistoryEntry]: ...
    def __getitem__(self, i: int | slice) -> HistoryEntry | Sequence[HistoryEntry]:
        if isinstance(i, slice):
            return [HistoryEntry(*row) for row in self._items[: self._n][i]]
        if not -self._n <= i < self._n:
            raise IndexError(i)
        return HistoryEntry(*self._items[i if i >= 0 else self._n + i])

    def __iter__(self) -> Iterator[HistoryEntry]:
        for row in self._items[: self._n]:
            yield HistoryEntry(*row)


class LazyUsage(Mapping[str, Any]):
    """The ledger's usage, read only if a condition looks at `usage` (most never do)."""

    __slots__ = ("_ledger", "_usage")

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._usage: dict[str, Any] | None = None

    def _get(self) -> dict[str, Any]:
        if self._usage is None:
            self._usage = self._ledger.usage()
        return self._usage

    def __getitem__(self, key: str) -> Any:
        return self._get()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())
