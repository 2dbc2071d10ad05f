"""A run: who runs it, its budget ledger, the history of its calls and the grants given in it.

The gate keeps one `RunContext` per run; conditions see its history as `history`
and its budget usage as `usage`, both read without copying.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, overload

from proctor.approval.base import Grant
from proctor.approval.grants import grant_admits
from proctor.calls import (
    BudgetFigures,
    BudgetHold,
    CallRecord,
    CallStatus,
    HistoryEntry,
    JSONValue,
    Outcome,
    RunInfo,
    SideEffect,
    TrimmedHistory,
)
from proctor.gate.budgets import FollowingLedger, LedgerPolicy
from proctor.policy.admission import LazyUsage
from proctor.policy.approvers import ApproverRule
from proctor.redaction import scrub

if TYPE_CHECKING:
    from proctor.gate.journal import StepJournal
    from proctor.policy.aggregates import Fold, Pipeline

__all__ = ["DEFAULT_HISTORY_LIMIT", "AgentContext", "HistoryView", "LazyUsage", "Ledger", "RunContext"]


class Ledger(Protocol):
    """What a run needs of a budget ledger, all of it; `proctor.policy.budgets.Ledger` is one, and
    `proctor.narrowing.StackedLedger` (a managed agent's) another. `tests/test_run_ledger.py` holds
    both to every promise here."""

    def reserve(self, tool: str, side_effect: SideEffect, cost: float) -> BudgetHold: ...
    def settle(self, hold: BudgetHold, *, duration_ns: int, cost: float | None = None) -> None: ...
    def release(self, hold: BudgetHold) -> None: ...
    def usage(self) -> dict[str, BudgetFigures]: ...
    def remaining(self) -> dict[str, BudgetFigures]: ...
    def spend(self, hold: BudgetHold) -> dict[str, BudgetFigures]: ...  # what a reserved call takes, per budget
    def next_step(self) -> None: ...
    #: A call that ran before a resume, counted in the run's own budgets again, never refused (shared pools
    #: counted it when it ran).
    def replay(self, tool: str, side_effect: SideEffect, cost: float, duration_ns: int) -> None: ...
    #: What a durable run saves of the budgets at a step's start, and puts back on resume.
    def snapshot(self) -> dict[str, JSONValue]: ...
    def restore(self, snapshot: Mapping[str, JSONValue]) -> None: ...
    #: Model use: counted by the budgets without `match` (`shared=False`: a reply replayed on resume).
    def charge_model(self, tokens: int, cost_usd: float, *, shared: bool = True) -> None: ...
    #: Raise `BudgetExceeded` once a model_tokens or model_cost_usd limit is reached.
    def check_model(self) -> None: ...


#: Calls whose raw rows and records a run keeps by default. Conditions do not depend on it: every read
#: of `history` is folded or indexed from the run's first call (`proctor.policy.aggregates`).
DEFAULT_HISTORY_LIMIT = 1000


class RunContext:
    """One run: who runs it, its budgets, its call history and the grants given during it.

    Memory is bounded in the length of the run: the raw history rows and call records of only the
    last `history_limit` calls are kept (older ones are dropped in chunks). Conditions still see
    the *whole* run: every read of `history` in a policy's conditions is a pipeline of
    `proctor.policy.aggregates` (a fold, a keyed index, the projected list, or a window the policy
    wrote), which the run feeds from its first call, before any row is dropped; their memory is
    what the conditions read, not a count of calls. `status_counts` counts every call.
    """

    # What a managed agent's view of the run (`AgentContext`, made by `delegate`) sets; a run's own
    # context keeps these class defaults, so the gate reads them at no cost per call.
    #: The tools calls of this context may name (None: the gate's own table).
    tools: Mapping[str, Any] | None = None
    #: The managed agents' own policies a call must also pass (`proctor.narrowing.Layer`), outermost first.
    layers: tuple[Any, ...] = ()
    #: The parent's call that handed this context's agent its task (None for the run's own agent).
    parent_call_id: str | None = None
    #: Agents running in this context's chain, the run's own first (managed agents add theirs).
    agents: tuple[str, ...] = ()
    #: A `time.monotonic()` past which calls of this context are refused (a managed agent's time), or None.
    deadline: float | None = None
    #: The strictest sandbox mode of the agents in this context's chain (`proctor.agent.managed.strictest_sandbox`):
    #: a managed agent's programs run in no weaker a sandbox. None: no agent running programs named one.
    sandbox_floor: str | None = None

    def __init__(self, info: RunInfo, ledger: Ledger, *, history_limit: int = DEFAULT_HISTORY_LIMIT) -> None:
        if history_limit < 1:
            raise ValueError("history_limit must be at least 1")
        self._lock = threading.Lock()
        self.info = info
        self.ledger = ledger
        self.history_limit = history_limit
        # The history as plain rows: a tuple is built in a fifth of a frozen HistoryEntry's time,
        # and most calls are decided without anyone reading the history. `_window` is (rows, how many
        # calls came before rows[0]), swapped as one: trimming replaces the list, so a snapshot keeps its own.
        self._window: tuple[list[_Row], int] = ([], 0)
        self._rows_lock = threading.Lock()
        self.records: _Records = _Records()
        self.status_counts: dict[CallStatus, int] = {}
        self.grants: list[Grant] = []
        # Labels of the tools whose calls ran (`seen` in conditions): kept as calls happen, never rebuilt.
        self._seen: set[str] = set()
        self._seen_sorted: tuple[str, ...] = ()
        self._folds: dict[str, Any] = {}  # pipeline key -> proctor.policy.aggregates.Fold
        self._fold_lock = threading.Lock()
        #: The journal of the step being run, for a durable run (`proctor.gate.journal.StepJournal`), else None.
        self.journal: StepJournal | None = None
        #: The audit seq of the run's `run_started` (None when no sink gave one): a durable run keeps it, sealed,
        #: so a resume reads the run's records from there (`AuditReader.run_records`).
        self.audit_start: int | None = None
        #: The audit seq of the record that opened this process's work on the run: its `run_started`, or the
        #: `run_resumed` of the resume that opened it here (None when no sink gave one). A run this process stops
        #: working on because another took it over names it (`Gate.finish_run`), so a verifier can see the other
        #: process's resume after it in the log, not only the store's word that there was one.
        self.opened_seq: int | None = None
        #: Clear values of redacted arguments met in this run: scrubbed from every free text
        #: written about it (programs, errors, chat content) — see `scrub`.
        self.secrets: set[str] = set()
        #: Called with each call's record as the gate settles it (`agent.run(task, stream=True)` sets it).
        self.on_call: Callable[[CallRecord], None] | None = None
        # The class defaults above, as instance attributes: the gate reads them on every call, and on
        # CPython 3.11 an instance attribute is read much faster than a class attribute through an instance.
        self.tools = None
        self.layers = ()
        self.parent_call_id = None
        self.agents = ()
        self.deadline = None
        #: Where values came from (`proctor.provenance.ProvenanceIndex`): kept by the gate only when its
        #: policy calls `provenance()`/`from_user()`; None otherwise (nothing is indexed, nothing costs).
        self.provenance: Any = None

    def scrub(self, text: str) -> str:
        """`text` without any clear value of a redacted argument seen in this run."""
        return scrub(text, tuple(self.secrets)) if self.secrets and text else text

    def follow_policy(self, policy: LedgerPolicy) -> None:
        """Count the run's calls on `policy`'s budgets from now on, when its ledger follows a reloading policy
        (`proctor.gate.budgets.FollowingLedger`); a ledger of one policy stays as it is."""
        if isinstance(self.ledger, FollowingLedger):
            self.ledger.follow(policy)

    def keep_provenance(self, make: Callable[[], Any]) -> Any:
        """The run's provenance index, made now with `make` (once, whichever call asks first) when the run
        has none: a policy that reads provenance came to decide a run that started without one."""
        with self._lock:
            if self.provenance is None:
                self.provenance = make()
            return self.provenance

    def next_step(self) -> int:
        """Start the next step of the run (resets `per: step` budgets); return its number."""
        with self._lock:
            self.info = replace(self.info, step=self.info.step + 1)
            self.ledger.next_step()
            return self.info.step

    @property
    def calls_made(self) -> int:
        """Calls recorded in this run so far (also those whose entries were dropped)."""
        rows, dropped = self._window
        return dropped + len(rows)

    def restore_dropped(self, dropped: int) -> None:
        """A resumed run that had dropped its first `dropped` calls' rows before it was saved: restored rows
        follow them, so conditions that needed the dropped ones know they are gone (and deny) instead of
        reading the restored rows as the run's first calls. Only before any call is remembered."""
        with self._rows_lock:
            rows, before = self._window
            if rows or before:
                raise ValueError("restore_dropped() comes before the run's rows are restored")
            self._window = ([], dropped)

    @property
    def history(self) -> list[HistoryEntry]:
        """The retained calls (the last `history_limit` or more), oldest first."""
        return list(self.history_view())

    def history_view(self) -> Sequence[HistoryEntry]:
        """The retained calls, as an O(1) read-only snapshot that can fold aggregates over the whole run."""
        rows, dropped = self._window
        return HistoryView(rows, len(rows), self, dropped)

    def track(self, pipelines: Iterable[Any]) -> None:
        """Fold these aggregate pipelines (`proctor.policy.aggregates.Pipeline`) from the start of the run,
        so they stay exact after entries are dropped (the gate passes its policy's at `start_run`)."""
        with self._fold_lock:
            for pipeline in pipelines:
                if pipeline.key not in self._folds:
                    self._folds[pipeline.key] = pipeline.new_fold(self._window[1])

    def aggregate(self, pipeline: Pipeline, upto: int) -> Fold:
        """The fold of `pipeline` over at least the first `upto` calls of the run (only new entries are fed)."""
        with self._fold_lock:
            fold = self._folds.get(pipeline.key)
            if fold is None:
                fold = self._folds[pipeline.key] = pipeline.new_fold(self._window[1])
            if fold.pos < upto:
                self._feed(fold, upto)
            return fold

    def _feed(self, fold: Any, upto: int) -> None:
        # Under _fold_lock. Rows are only dropped under it too, so [pos, upto) is still here.
        rows, base = self._window
        for i in range(fold.pos - base, min(upto - base, len(rows))):
            fold.feed(HistoryEntry(*rows[i]).as_dict())

    def seen_labels(self) -> tuple[str, ...]:
        """The labels of the tools whose calls ran in this run so far, sorted (`seen` in conditions)."""
        return self._seen_sorted

    def usage_view(self) -> Mapping[str, Any]:
        """This context's budget usage (`usage` in conditions), read only when a condition looks at it."""
        return LazyUsage(self.ledger)

    def remember_entry(self, entry: HistoryEntry, record: CallRecord) -> None:
        """`remember` a call given as a history entry."""
        self.remember(entry.tool, entry.args, entry.side_effect, entry.decision, entry.status, record,
                      labels=entry.labels)

    def remember(self, tool: str, args: Mapping[str, Any], side_effect: SideEffect, decision: Outcome,
                 status: CallStatus, record: CallRecord, labels: tuple[str, ...] = ()) -> None:
        """Add a call that ended to the run: its history row, its record, its status count and, if its tool
        started, its labels to `seen` (the gate's recorder does this for every call; a resumed run for the
        calls it restores)."""
        # A snapshot taken by another thread sees a prefix of the rows (append and len are atomic).
        with self._rows_lock:
            rows = self._window[0]
            rows.append((tool, args, side_effect, decision, status, labels))
            self.records.append(record, self.history_limit)
            counts = self.status_counts
            counts[status] = counts.get(status, 0) + 1
            full = len(rows) >= 2 * self.history_limit
        if labels and status in _RAN and not self._seen.issuperset(labels):
            with self._lock:
                self._seen.update(labels)
                self._seen_sorted = tuple(sorted(self._seen))
        if full:
            self.trim_history()
        if self.on_call is not None:
            self.on_call(record)

    def trim_history(self) -> None:
        """Drop the oldest rows, down to `history_limit`, once every fold has taken them in (`remember`
        does this once the rows are twice that long)."""
        with self._fold_lock:
            rows, dropped = self._window
            end = dropped + len(rows) - self.history_limit
            if end <= dropped:
                return  # another thread trimmed first
            for fold in self._folds.values():
                if fold.pos < end:
                    self._feed(fold, end)
            with self._rows_lock:
                rows, dropped = self._window  # appended to meanwhile, never trimmed (we hold _fold_lock)
                self._window = (rows[end - dropped :], end)

    def granted(self, tool: str, args: Mapping[str, Any], grants: Sequence[Grant] | None = None,
                approvers: Sequence[ApproverRule] = (), policy_sha256: str = "") -> Grant | None:
        """The first grant of this run (or of `grants`, a layer's) that admits this call, given under the policy
        that decided it (`policy_sha256`), whose `approvers:` (the specs its rules require) the grant's own call
        required too; or None."""
        with self._lock:
            for grant in self.grants if grants is None else grants:
                # safe on free text: proctor.approval.grants
                if (grant_admits(grant, tool, args) and grant.covers_policy(policy_sha256)
                        and grant.covers_approvers(approvers)):
                    return grant
        return None

    def add_grant(self, grant: Grant, grants: list[Grant] | None = None) -> None:
        """Keep a grant an approver gave: in this run's grants, or in `grants` (a layer's)."""
        with self._lock:
            (self.grants if grants is None else grants).append(grant)

    def delegate(self, agent: str, *, ledger: Ledger, tools: Mapping[str, Any], layer: Any = None,
                 parent_call_id: str, deadline: float | None = None) -> AgentContext:
        """The view of this run a managed agent `agent` works in (see `AgentContext`).

        `ledger` counts its calls (it must draw on this context's ledger: `proctor.narrowing.StackedLedger`),
        `tools` is the table its calls may name, `layer` its own policy (it can only narrow), and
        `deadline` the `time.monotonic()` its calls are refused after (the earlier of this one's and it).
        """
        if deadline is None or (self.deadline is not None and self.deadline < deadline):
            deadline = self.deadline
        root = self._root if isinstance(self, AgentContext) else self
        return AgentContext(root, replace(self.info, step=0, agent=agent), ledger, tools=tools,
                            layers=self.layers + ((layer,) if layer is not None else ()),
                            parent_call_id=parent_call_id, agents=(*self.agents, agent), deadline=deadline)


class AgentContext(RunContext):
    """A managed agent's view of its parent's run: the same run (id, history, records, `seen`,
    secrets, grants, the budgets it draws on) with its own `run.agent`, step counter, tool table,
    narrowing layers and deadline. Everything not set here is read from the run's own context
    (its properties); methods that change run state are sent to it, so nothing forks.
    """

    def __init__(self, root: RunContext, info: RunInfo, ledger: Ledger, *, tools: Mapping[str, Any],
                 layers: tuple[Any, ...], parent_call_id: str, agents: tuple[str, ...],
                 deadline: float | None) -> None:
        # RunContext.__init__ is not called: the run's state is the root's, read through the properties below.
        self._root = root
        self.info = info
        self.ledger = ledger
        self.tools = tools
        self.layers = layers
        self.parent_call_id = parent_call_id
        self.agents = agents
        self.deadline = deadline
        self.journal = None  # a managed agent's calls are not journaled: it cannot suspend (docs/agents.md)
        self.on_call = None
        self._step_lock = threading.Lock()

    # The run's state is the root's, named one by one (not forwarded wholesale): what a managed agent's
    # calls read and add to is the same run, and a new piece of run state is shared on purpose.
    @property
    def records(self) -> _Records:  # type: ignore[override]
        return self._root.records

    @property
    def status_counts(self) -> dict[CallStatus, int]:  # type: ignore[override]
        return self._root.status_counts

    @property
    def grants(self) -> list[Grant]:  # type: ignore[override]
        return self._root.grants

    @property
    def secrets(self) -> set[str]:  # type: ignore[override]
        return self._root.secrets

    @property
    def history_limit(self) -> int:  # type: ignore[override]
        return self._root.history_limit

    @property
    def provenance(self) -> Any:
        return self._root.provenance

    @provenance.setter
    def provenance(self, value: Any) -> None:
        self._root.provenance = value

    @property
    def audit_start(self) -> int | None:  # type: ignore[override]
        return self._root.audit_start

    @property
    def opened_seq(self) -> int | None:  # type: ignore[override]
        return self._root.opened_seq

    def next_step(self) -> int:
        """Start the managed agent's next step (its own `per: step` budgets; the parent's step goes on)."""
        with self._step_lock:
            self.info = replace(self.info, step=self.info.step + 1)
            self.ledger.next_step()
            return self.info.step

    @property
    def calls_made(self) -> int:
        return self._root.calls_made

    @property
    def history(self) -> list[HistoryEntry]:
        return self._root.history

    def history_view(self) -> Sequence[HistoryEntry]:
        return self._root.history_view()

    def track(self, pipelines: Iterable[Any]) -> None:
        self._root.track(pipelines)

    def aggregate(self, pipeline: Pipeline, upto: int) -> Fold:
        return self._root.aggregate(pipeline, upto)

    def seen_labels(self) -> tuple[str, ...]:
        return self._root.seen_labels()

    def scrub(self, text: str) -> str:
        return self._root.scrub(text)

    def keep_provenance(self, make: Callable[[], Any]) -> Any:
        return self._root.keep_provenance(make)

    def follow_policy(self, policy: LedgerPolicy) -> None:
        self._root.follow_policy(policy)  # the run's budgets; this agent's own (a layer) are its static policy's

    def remember(self, tool: str, args: Mapping[str, Any], side_effect: SideEffect, decision: Outcome,
                 status: CallStatus, record: CallRecord, labels: tuple[str, ...] = ()) -> None:
        self._root.remember(tool, args, side_effect, decision, status, record, labels=labels)
        if self.on_call is not None:
            self.on_call(record)

    def trim_history(self) -> None:
        self._root.trim_history()

    def restore_dropped(self, dropped: int) -> None:
        self._root.restore_dropped(dropped)

    def granted(self, tool: str, args: Mapping[str, Any], grants: Sequence[Grant] | None = None,
                approvers: Sequence[ApproverRule] = (), policy_sha256: str = "") -> Grant | None:
        return self._root.granted(tool, args, grants, approvers, policy_sha256)

    def add_grant(self, grant: Grant, grants: list[Grant] | None = None) -> None:
        self._root.add_grant(grant, grants)


#: Statuses of a call whose tool started: its labels join the run's `seen`.
_RAN = frozenset(("ok", "failed", "timeout", "unknown"))

_Row = tuple[str, Mapping[str, Any], SideEffect, Outcome, CallStatus, tuple[str, ...]]


class _Records(Sequence[CallRecord]):
    """The run's call records, indexed from the run's first call; only the last ones are kept.

    ``len()`` counts every call, so ``records[len(records):]`` taken at a step's start gives that
    step's calls later (those still kept); iterating gives the kept records, oldest first.
    """

    __slots__ = ("_state",)

    def __init__(self) -> None:
        self._state: tuple[list[CallRecord], int] = ([], 0)  # (kept records, how many were dropped before them)

    def append(self, record: CallRecord, keep: int) -> None:
        """Add one record (callers serialise appends); past 2 * `keep`, drop down to the last `keep`."""
        items = self._state[0]
        items.append(record)
        if len(items) >= 2 * keep:
            self.trim(keep)

    def trim(self, keep: int) -> None:
        """Drop all but the last `keep` records (callers serialise this with appends)."""
        items, dropped = self._state
        cut = len(items) - keep
        if cut > 0:
            self._state = (items[cut:], dropped + cut)

    def __len__(self) -> int:
        items, dropped = self._state
        return dropped + len(items)

    @overload
    def __getitem__(self, i: int) -> CallRecord: ...
    @overload
    def __getitem__(self, i: slice) -> list[CallRecord]: ...
    def __getitem__(self, i: int | slice) -> CallRecord | list[CallRecord]:
        items, dropped = self._state
        n = dropped + len(items)
        if isinstance(i, slice):
            start, stop, step = i.indices(n)
            return items[max(start - dropped, 0) : max(stop - dropped, 0) : step]
        if not -n <= i < n:
            raise IndexError(i)
        j = (i if i >= 0 else n + i) - dropped
        if j < 0:
            raise IndexError(f"record {i} was dropped (only the last {len(items)} are kept)")
        return items[j]

    def __iter__(self) -> Iterator[CallRecord]:
        return iter(self._state[0])


class HistoryView(TrimmedHistory):
    """The first `n` rows of an append-only list, as entries, without copying it; `dropped` calls came before."""

    __slots__ = ("_base", "_items", "_n", "_run")

    def __init__(self, items: list[_Row], n: int, run: RunContext | None = None, base: int = 0) -> None:
        self._items, self._n, self._run, self._base = items, n, run, base

    def aggregate(self, pipeline: Pipeline) -> Fold:
        """The fold of `pipeline` over every call of the run up to (at least) this snapshot (see RunContext)."""
        if self._run is None:
            raise LookupError("no run to fold over")
        return self._run.aggregate(pipeline, self._base + self._n)

    @property
    def dropped(self) -> int:
        """How many calls of the run came before the first row here (their rows were dropped)."""
        return self._base

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
