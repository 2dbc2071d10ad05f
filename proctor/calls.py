"""The vocabulary every part shares: a call, its decision, its record, its run.

These are plain frozen dataclasses so the policy engine, the gate, approvers, the
audit trail and telemetry can pass them around without importing one another.
"""

from __future__ import annotations

import os
import re
from abc import abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeAlias, TypeVar

if TYPE_CHECKING:
    from proctor.policy.aggregates import Fold, Pipeline
    from proctor.provenance import ProvenanceIndex

__all__ = [
    "TrimmedHistory",
    "OUTCOMES",
    "SIDE_EFFECTS",
    "STATUSES",
    "BudgetFigures",
    "BudgetHold",
    "Call",
    "CallPosition",
    "CallRecord",
    "CallStatus",
    "Decision",
    "HistoryEntry",
    "JSONValue",
    "Outcome",
    "RunInfo",
    "SideEffect",
    "line_widths",
    "new_id",
    "side_effect_rank",
    "source_lines",
]

#: A value proctor carries without a fixed type: what JSON carries (an audit record's fields, a tool's schema, a
#: store's row, what `json.loads` returns) and what a program hands a tool as an argument (checked by the tool's
#: schema at run time, not by the type checker). Arbitrary by nature; where it crosses a seam it is named so, and
#: `Any` there means nothing else (tests/test_layout.py refuses a bare `Any` in a Protocol).
JSONValue: TypeAlias = Any

#: What one budget has used or has left, by measure (calls, cost, wall_time_ms, model_tokens, model_cost_usd):
#: None where it cannot be read (a shared pool out of reach).
BudgetFigures: TypeAlias = dict[str, float | None]


_Hold = TypeVar("_Hold", bound="BudgetHold")


class BudgetHold:
    """A call's hold on the budgets, as a ledger's `reserve` hands it out and its `settle`, `release` and `spend`
    take it back: the gate keeps it without looking inside. Each ledger's own kind derives from it
    (`proctor.policy.Reservation`, a managed agent's stacked pair) and refuses one it did not make."""

    __slots__ = ()

    @classmethod
    def given_back(cls: type[_Hold], hold: BudgetHold, ledger: str) -> _Hold:
        """`hold`, given back to the ledger called `ledger`, as that ledger's kind (`cls`) of hold; a hold of
        another kind is a caller's bug (TypeError): it goes back to the ledger whose reserve() made it."""
        if not isinstance(hold, cls):
            raise TypeError(f"a {type(hold).__name__} was given back to a {ledger}, which made none: a reservation "
                            "goes back to the ledger whose reserve() made it")
        return hold


SideEffect = Literal["none", "read", "write", "external", "destructive"]
#: Side-effect classes, least to most dangerous.
SIDE_EFFECTS: tuple[SideEffect, ...] = ("none", "read", "write", "external", "destructive")

Outcome = Literal["allow", "deny", "require_approval"]
OUTCOMES: tuple[Outcome, ...] = ("allow", "deny", "require_approval")

#: How a call ended: the tool returned (ok, failed, timeout), it was refused before it started
#: (denied), it started and its result is not known (unknown: the host was interrupted while it
#: ran), or the host was interrupted before it started (cancelled).
CallStatus = Literal["ok", "denied", "failed", "timeout", "unknown", "cancelled"]
STATUSES: tuple[CallStatus, ...] = ("ok", "denied", "failed", "timeout", "unknown", "cancelled")

_RANK: dict[str, int] = {name: i for i, name in enumerate(SIDE_EFFECTS)}


def side_effect_rank(side_effect: str) -> int:
    """Position of a class in `SIDE_EFFECTS`; unknown classes rank as destructive."""
    return _RANK.get(side_effect, _RANK["destructive"])


def new_id(prefix: str = "") -> str:
    """A fresh random 128-bit id in hex, optionally prefixed (``call_…``, ``run_…``)."""
    chunk = next(_pool, None)
    if chunk is None:
        chunk = _refill()
    return prefix + chunk


# os.urandom bytes are fetched 4 KiB at a time and turned into hex at once: one getrandom() syscall and
# one hex() per 256 ids, not one each (3.4k -> 2.8k instructions an id, callgrind). A list iterator hands
# out its items atomically, so threads need no lock; two threads refilling at once each use their own
# fresh bytes. A forked child forgets the pool, so parent and child never hand out the same bytes.
_pool: Iterator[str] = iter(())


def _refill() -> str:
    global _pool
    data = os.urandom(4096).hex()
    fresh = iter([data[i : i + 32] for i in range(0, 8192, 32)])
    chunk = next(fresh)
    _pool = fresh
    return chunk


def _forget_pool() -> None:
    global _pool
    _pool = iter(())


os.register_at_fork(after_in_child=_forget_pool)


@dataclass(frozen=True, slots=True)
class Decision:
    """What the policy decided about one call, and which rules decided it."""

    outcome: Outcome
    rules: tuple[str, ...]
    reason: str
    policy_sha256: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "rules": list(self.rules),
            "reason": self.reason,
            "policy_sha256": self.policy_sha256,
        }


_NEWLINE = re.compile(r"\r\n|\r|\n")
_NUMBER = r"(0|[1-9][0-9]{0,8})"
_POSITION = re.compile(f"([1-9][0-9]{{0,8}})(?::{_NUMBER}:{_NUMBER}:{_NUMBER})?", re.ASCII)


def source_lines(code: str) -> list[str]:
    """A program's lines as Python numbers them: split at ``\n``, ``\r\n`` and ``\r`` only (`str.splitlines`
    also splits at U+2028, form feeds and others the compiler reads inside a line, which would put
    every later line off by one)."""
    return _NEWLINE.split(code)


def line_widths(code: str) -> list[int]:
    """Each of the program's lines (`source_lines`) in UTF-8 bytes: what `CallPosition.within` checks."""
    return [len(line.encode()) for line in source_lines(code)]


class CallPosition(NamedTuple):
    """Where a program made a call: the call expression's first line (1-based) and column (0-based, in
    UTF-8 bytes, as `ast` counts), and its last line and end column (None where the interpreter keeps
    no columns). Reported by the worker, checked by the host against the program it ran."""

    line: int
    col: int | None = None
    end_line: int | None = None
    end_col: int | None = None

    def as_dict(self) -> dict[str, int | None]:
        return {"line": self.line, "col": self.col, "end_line": self.end_line, "end_col": self.end_col}

    @classmethod
    def parse(cls, text: str) -> CallPosition | None:
        """``LINE:COL:END_LINE:END_COL`` or ``LINE`` as the worker writes it (`channel.call_frame`); None
        for anything else, or an end before the start."""
        found = _POSITION.fullmatch(text)  # (no leading zeros: `text()` gives back exactly what was sent)
        if found is None:
            return None
        line, col, end_line, end_col = found.groups()
        if col is None:
            return cls(int(line))
        at = cls(int(line), int(col), int(end_line), int(end_col))
        return None if (at[2], at[3]) < (at[0], at[1]) else at

    def text(self) -> str:
        """The form `parse` reads."""
        if self.col is None or self.end_line is None or self.end_col is None:
            return str(self.line)
        return f"{self.line}:{self.col}:{self.end_line}:{self.end_col}"

    def within(self, widths: Sequence[int]) -> CallPosition | None:
        """This position if it lies inside the program whose lines are `widths` UTF-8 bytes long (the
        one the worker was given: `line_widths`), else None: a worker's report is a claim, and one
        pointing past the program marks nothing."""
        if self.line > len(widths):
            return None
        if self.col is None or self.end_line is None or self.end_col is None:
            return self
        if self.end_line > len(widths) or self.col > widths[self.line - 1] or self.end_col > widths[self.end_line - 1]:
            return None
        return self


@dataclass(frozen=True, slots=True)
class RunInfo:
    """Who is running what: the `run` variable of policy conditions."""

    id: str = field(default_factory=lambda: new_id("run_"))
    step: int = 0
    principal: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    #: The name of the agent making the call (`run.agent`): the run's own agent, or a managed
    #: agent it handed a task to (its calls belong to the same run); None outside agents.
    agent: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "step": self.step, "principal": self.principal, "labels": dict(self.labels),
                "agent": self.agent}


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """An earlier call of the same run, as policy conditions see it (`history`)."""

    tool: str
    args: Mapping[str, Any]
    side_effect: SideEffect
    decision: Outcome
    status: CallStatus
    #: The tool's labels (policy `tools: X: {labels: [...]}`), whether or not the call ran.
    labels: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "args": dict(self.args),
            "side_effect": self.side_effect,
            "decision": self.decision,
            "status": self.status,
            "labels": list(self.labels),
        }


class TrimmedHistory(Sequence[HistoryEntry]):
    """A run's history whose first `dropped` calls are no longer held (the gate keeps a bounded window).

    Policy conditions that read raw history rows check `dropped` and refuse to decide on a part of the run;
    the gate's run context provides the one implementation."""

    __slots__ = ()

    @property
    @abstractmethod
    def dropped(self) -> int:
        """How many calls of the run came before the first row here."""

    @abstractmethod
    def aggregate(self, pipeline: Pipeline) -> Fold:
        """The fold of a history pipeline over every call of the run up to this snapshot, kept by the run as
        calls end (`proctor.policy.aggregates`): conditions read it instead of walking the rows."""


@dataclass(frozen=True, slots=True)
class Call:
    """One tool call as the policy sees it.

    `side_effect` and `cost` are what the tool itself declares; the policy's
    `tools:` section overrides both, and a tool declared nowhere is destructive.
    """

    tool: str
    args: Mapping[str, Any] = field(default_factory=dict)
    side_effect: SideEffect | None = None
    cost: int | None = None
    history: Sequence[HistoryEntry] = ()
    run: RunInfo = field(default_factory=RunInfo)
    usage: Mapping[str, Any] = field(default_factory=dict)
    #: Labels of the tools whose calls ran earlier in the run (sorted, distinct): `seen` in conditions.
    seen: Sequence[str] = ()
    #: Where values came from (`proctor.provenance.ProvenanceIndex`): what `provenance()` and
    #: `from_user()` read. None outside a run that indexes (they then find no source).
    provenance: ProvenanceIndex | None = None


@dataclass(frozen=True, slots=True)
class CallRecord:
    """What happened to one call: the entry of `ExecutionResult.tool_calls`."""

    call_id: str
    tool: str
    args: Mapping[str, Any]
    side_effect: SideEffect
    decision: Decision | None
    status: CallStatus
    duration_ns: int
    error: str | None = None
    error_type: str | None = None
    approval: str | None = None
    #: The budget that refused the call, when one did.
    budget: str | None = None

    @property
    def duration(self) -> float:
        """Duration in seconds."""
        return self.duration_ns / 1e9

    def as_dict(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "tool": self.tool,
            "args": dict(self.args),
            "side_effect": self.side_effect,
            "decision": self.decision.as_dict() if self.decision else None,
            "status": self.status,
            "duration_ns": self.duration_ns,
            "error": self.error,
            "error_type": self.error_type,
            "approval": self.approval,
            "budget": self.budget,
        }
