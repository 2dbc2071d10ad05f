"""The run store: what a durable run keeps so it can stop in one process and go on in another.

A store holds three things, each keyed so that several processes can share it:

- **runs** (`RunRecord`): the run's task, principal, labels, policy fingerprint, the
  model's messages, finished steps, and the state at the start of the step in
  progress (budgets used, grants, history, the step's program) — everything a
  resume needs besides the journal;
- **the journal** (`JournalEntry`): per run and step, one entry per call the step's
  program made, in order (`seq` 0, 1, …). An entry is written as an *intent* before
  the tool runs and completed with its *outcome* (value or error) after; calls
  refused before running are journaled complete. A resumed step answers its first
  calls from these entries instead of running the tools again;
- **approvals** (`PendingApproval`): calls waiting for a human, answered from
  anywhere (the CLI, the inbox, Python). An answer is accepted only with the
  approval's `binding` (sha256 of tool, arguments, call id and policy fingerprint),
  so a stale answer can never approve other arguments or another policy.

`RunStore.open(url)` picks the implementation by the URL's scheme: a path or
``sqlite:///path`` is the embedded SQLite store; ``postgresql://…`` the PostgreSQL
one (fleet), as `proctor.backends` maps them. Implementations subclass `RunStore`; another
one is added with `register_scheme`. Values in records are JSON data (the channel's tagged encoding
for tool results), so every implementation stores the same things.

Every method may be called from any thread. Methods raise `StoreError` (or a
subclass) and nothing else for storage problems.
"""

from __future__ import annotations

import datetime as _dt
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, Protocol

from proctor import backends
from proctor.canonical import json_shaped

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

#: A run's state in the store. ``running``: a process is working on it (or died doing so);
#: ``suspended``: waiting for answers to `RunRecord.pending`; the rest are endings.
RunState = Literal["running", "suspended", "done", "max_steps", "budget_exhausted", "error", "cancelled"]
RUN_STATES: tuple[RunState, ...] = ("running", "suspended", "done", "max_steps", "budget_exhausted", "error",
                                    "cancelled")
#: ``pending`` until answered; ``answered`` once; ``void`` when the call it was for will never use it
#: (the run was cancelled, or resumed under a changed policy and asked again).
#: ``expired``: its deadline passed with no answer (read as such as soon as it has; no answer is taken after it).
ApprovalState = Literal["pending", "answered", "void", "expired"]
APPROVAL_STATES: tuple[ApprovalState, ...] = ("pending", "answered", "void", "expired")


def _iso(ns: int) -> str:
    return _dt.datetime.fromtimestamp(ns / 1e9, tz=_dt.timezone.utc).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class RunRecord:
    """One durable run.

    `step` is the action step in progress (0 before the first); `messages`, `history`,
    `budgets` and `grants` are as they were when that step *started*, so a resume
    restores them and replays the step's journal on top. `step_state` holds the step in
    progress (the model's output and the program, ``{"model_output", "code", "seed", …}``);
    `steps` the finished steps (`StepRecord.as_dict()`); `pending` the ids of the
    approvals a suspended run waits for. `owner` is the ``host:pid:nonce`` of the process
    working on it (the name it claims the run with). `trace_id`/`span_id` name the run's first
    `invoke_agent` span, so a resumed run's spans link to it. `version` is bumped by
    every `save_run`.
    """

    run_id: str
    task: str
    status: RunState = "running"
    principal: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    policy_sha256: str = ""
    agent: str = ""
    step: int = 0
    messages: Sequence[Mapping[str, Any]] = ()
    steps: Sequence[Mapping[str, Any]] = ()
    step_state: Mapping[str, Any] | None = None
    history: Sequence[Mapping[str, Any]] = ()
    #: How many of the run's first calls `history` no longer holds (dropped past the history limit).
    history_dropped: int = 0
    budgets: Mapping[str, Any] = field(default_factory=dict)
    grants: Sequence[Mapping[str, Any]] = ()
    pending: Sequence[str] = ()
    seed: int = 0
    trace_id: str | None = None
    span_id: str | None = None
    answer: Any = None
    error: str | None = None
    owner: str | None = None
    created_at_ns: int = 0
    updated_at_ns: int = 0
    version: int = 0
    #: Per step (as a string), the journal the run had written when it saved this record: ``{"count", "head"}``.
    journal_heads: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: The seq of the run's `run_started` in its audit trail (None: not known), where a resume starts reading the
    #: run's records from the trail; sealed, and checked against the trail before it is used.
    audit_start: int | None = None
    #: The run's seal over every field a resume reads (`proctor.store.seal`); "" when never sealed.
    seal: str = ""

    def __post_init__(self) -> None:
        _normalise(self, ("messages", "steps", "history", "grants", "pending"), ("labels", "budgets", "journal_heads"))

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = json_shaped(asdict(self))
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunRecord:
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in known})

    def evolve(self, **changes: Any) -> RunRecord:
        return replace(self, **changes)


@dataclass(frozen=True)
class JournalEntry:
    """One call of a step's program, in program order (`seq` from 0).

    ``state == "intent"``: the tool was about to run (it may have, if the process died);
    ``"suspended"``: the run stopped at this call to wait for an approval (nothing ran);
    ``"done"``: `status` (``ok | denied | failed | timeout``) and `value` (the channel's
    JSON encoding of the result) or `error` (``{"type", "message", …}``) are final.
    `args_digest` is the canonical sha256 of the validated arguments: a replayed call
    must ask for the same tool with the same digest. `args` are the validated
    arguments (the history that policy conditions read; the store is host-side),
    `record` the call's `CallRecord.as_dict()`, `history` its history row, `grant` a
    grant its approval gave.
    """

    run_id: str
    step: int
    seq: int
    call_id: str
    tool: str
    args_digest: str
    state: Literal["intent", "suspended", "done"] = "intent"
    status: str | None = None
    value: Any = None
    error: Mapping[str, Any] | None = None
    args: Mapping[str, Any] = field(default_factory=dict)
    record: Mapping[str, Any] | None = None
    history: Mapping[str, Any] | None = None
    grant: Mapping[str, Any] | None = None
    ts_ns: int = 0
    #: The entry's seal, chained on the one before it in the step (`proctor.store.seal`); "" when never sealed.
    seal: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JournalEntry:
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class ApprovalAnswer:
    """A human's answer as stored: verdict (``approve | deny | edit | grant``), who, why, edited args, grant,
    and where from (`address`: the client address the inbox saw, for the audit record)."""

    verdict: str
    approver: str
    reason: str = ""
    args: Mapping[str, Any] | None = None
    grant: Mapping[str, Any] | None = None
    answered_at_ns: int = 0
    address: str = ""
    #: How `approver` was proven (`proctor.policy.approvers.METHODS`: token, session, os-user, …).
    method: str = ""
    #: The OS user the answer was given from, when it came through the store (`proctor approvals --store`).
    os_user: str = ""
    #: The groups the answerer's proof gave `approver` (the inbox: the token file; the CLI: the policy's
    #: ``approval.os_users``); None when that proof gives none. Sealed with the answer, for the record: the
    #: gate learns the groups again from its own policy.
    groups: Sequence[str] | None = None
    #: The answerer's seal over the answer and the approval it answers (`proctor.store.answerseal`): the
    #: gate believes no answer without one that holds under the run's answer key.
    seal: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.groups, (list, tuple)):  # (anything else a store holds just fails its seal)
            object.__setattr__(self, "groups", list(self.groups))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ApprovalAnswer:
        """An answer as a store holds it; fields it lacks are empty (such an answer's seal does not hold)."""
        known = cls.__dataclass_fields__
        return cls(**{"verdict": "", "approver": "", **{k: v for k, v in data.items() if k in known}})


@dataclass(frozen=True)
class PendingApproval:
    """A call waiting for a human, as filed in the store.

    `args` are redacted as the policy says (what approvers may see). `binding` is what
    an answer must echo (`proctor.approval.approval_binding`). `step`/`seq` place the
    call in its run's journal.
    """

    id: str
    run_id: str
    call_id: str
    tool: str
    binding: str
    policy_sha256: str
    side_effect: str = "destructive"
    args: Mapping[str, Any] = field(default_factory=dict)
    step: int = 0
    seq: int = 0
    principal: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    rules: Sequence[str] = ()
    reason: str = ""
    budget: Mapping[str, Any] = field(default_factory=dict)
    requested_at_ns: int = 0
    expires_at_ns: int | None = None
    status: ApprovalState = "pending"
    answer: ApprovalAnswer | None = None
    #: The tool's JSON Schema of parameters (edits are checked against it before they are stored).
    parameters: Mapping[str, Any] = field(default_factory=dict)
    #: The arguments as an approver sees them: clear, but for fields the policy hides from approvers
    #: (``hide_from_approvers``, shown as their ``{"$redacted": …}`` marker). None when they are `args`.
    shown_args: Mapping[str, Any] | None = None
    #: Where in the step's program the call was made (1-based lines, 0-based columns in UTF-8 bytes: the
    #: call expression's start and end), as the interpreter reported it; None when it was not reported.
    line: int | None = None
    col: int | None = None
    end_line: int | None = None
    end_col: int | None = None
    #: What the call takes from each budget it counts against (``{budget: {"calls": 1, "cost": 10}}``);
    #: `budget` holds what each has left once it is taken.
    spend: Mapping[str, Any] = field(default_factory=dict)
    #: Who may answer, as the policy said when the call was filed: ``{"require": [spec…], "os_users": {…}}``
    #: (`proctor.policy.approvers`). A convenience for refusing early; the gate checks again with its policy.
    approvers: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _normalise(self, ("rules",), ("args", "labels", "budget", "parameters", "approvers", "spend"))
        if self.shown_args is not None:
            object.__setattr__(self, "shown_args", dict(self.shown_args))

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (`proctor approvals list --json`, the inbox API)."""
        out: dict[str, Any] = json_shaped(asdict(self))
        out["requested_at"] = _iso(self.requested_at_ns)
        out["expires_at"] = _iso(self.expires_at_ns) if self.expires_at_ns else None
        out["answer"] = self.answer.as_dict() if self.answer else None
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PendingApproval:
        known = cls.__dataclass_fields__
        values = {k: v for k, v in data.items() if k in known}
        answer = values.get("answer")
        if isinstance(answer, Mapping):
            values["answer"] = ApprovalAnswer.from_dict(answer)
        elif answer is not None:  # not an answer at all: read as an empty one, whose seal does not hold
            values["answer"] = ApprovalAnswer("", "")
        expires = values.get("expires_at_ns")
        if values.get("status") == "pending" and isinstance(expires, int) and time.time_ns() > expires:
            values["status"] = "expired"  # the deadline holds whoever reads it first, before anyone writes
        return cls(**values)


def _normalise(obj: object, sequences: tuple[str, ...], mappings: tuple[str, ...]) -> None:
    """Sequences as lists and mappings as dicts, so a record equals itself read back from JSON."""
    for name in sequences:
        object.__setattr__(obj, name, list(getattr(obj, name)))
    for name in mappings:
        object.__setattr__(obj, name, dict(getattr(obj, name)))




class RunStore(Protocol):
    """Where durable runs, their journals and their pending approvals live (see the module docstring).

    Implementations subclass this class explicitly (so they inherit `open`) and
    implement every method below with these semantics.
    """

    #: The URL the store was opened with.
    url: str

    @staticmethod
    def open(url: str | os.PathLike[str], *, create: bool = True) -> RunStore:
        """Open the store named by `url`: a path or ``sqlite:///path``, or ``postgresql://…`` (`proctor.backends`);
        `create` False: a SQLite file that does not exist is a `StoreError`, not a new empty store."""
        return backends.open_store(url, create=create)

    # -- runs -------------------------------------------------------------------------------------

    def create_run(self, record: RunRecord) -> RunRecord:
        """Store a new run (version 1, timestamps set); `StoreError` if its id exists."""
        ...

    def save_run(self, record: RunRecord) -> RunRecord:
        """Replace a run's record; returns it with `version` bumped and `updated_at_ns` set.

        Raises `StoreConflict` when `record.version` is not the stored version (someone
        else saved it since it was read), and `RunNotFound` when there is no such run.
        """
        ...

    def get_run(self, run_id: str) -> RunRecord:
        """The run's record; `RunNotFound` if there is none."""
        ...

    def list_runs(self, *, status: RunState | None = None, limit: int = 100) -> list[RunRecord]:
        """Runs, most recently updated first, optionally only those in `status`."""
        ...

    def claim_run(self, run_id: str, owner: str, lease_s: float = 60.0) -> bool:
        """Take the run for `owner` (a resuming process) unless another owner holds an unexpired lease.

        Returns whether `owner` holds it now. Claiming again renews the lease.
        """
        ...

    def release_run(self, run_id: str, owner: str) -> None:
        """Give the run back, if `owner` holds it."""
        ...

    def cancel_run(self, run_id: str, reason: str = "") -> RunRecord:
        """Mark a run cancelled and void its pending approvals; a finished run is returned unchanged."""
        ...

    # -- journal ----------------------------------------------------------------------------------

    def journal_write(self, entry: JournalEntry, *, durable: bool = True, owner: str | None = None) -> None:
        """Write (or complete) the entry at (run_id, step, seq).

        With `durable` it is on stable storage when this returns (an intent of a call with
        effects); without, it survives the process being killed but perhaps not a power cut
        (outcomes, and intents of reads: losing one only makes a resume run a read again or
        report an outcome as unknown). With `owner`, it is written only while `owner` holds the
        run's claim (`claim_run`), in the same transaction; else `RunTakenOver`: another process
        took the run over (its lease ran out), and what this one would write is not the run's."""
        ...

    def journal(self, run_id: str, step: int) -> list[JournalEntry]:
        """The step's entries in `seq` order (empty when the step made no calls)."""
        ...

    # -- approvals --------------------------------------------------------------------------------

    def file_approval(self, approval: PendingApproval) -> PendingApproval:
        """File a request, or return the one already filed with the same `binding`.

        A request for the same call, arguments and policy (same binding) that is pending
        or answered is returned as stored, so a resumed run finds its answer. Any other
        *pending* approval of the same run and `call_id` is voided: it was for other
        arguments or another policy and can no longer be used. (Durable runs give a call
        the same id when its step is re-run.)
        """
        ...

    def get_approval(self, approval_id: str) -> PendingApproval:
        """The approval; `ApprovalNotFound` if there is none."""
        ...

    def list_approvals(self, *, status: ApprovalState | None = "pending", run_id: str | None = None
                       ) -> list[PendingApproval]:
        """Approvals, newest first; by default only pending ones."""
        ...

    def answer_approval(self, approval_id: str, answer: ApprovalAnswer, *, binding: str) -> PendingApproval:
        """Answer a pending approval, exactly once.

        `ApprovalConflict` when `binding` is not the approval's (a stale page, changed
        arguments or policy) or it is no longer pending; `ApprovalNotFound` when absent.
        Waiters (`wait_for_answer`, in any process) wake up.
        """
        ...

    def reopen_approval(self, approval_id: str, answer: ApprovalAnswer) -> bool:
        """Take back `answer`, which the gate refused (its seal does not hold: written into the store by hand,
        copied from another approval): the approval is pending again, answerable by a real approver until its
        deadline. Only while the approval still holds exactly `answer` (True); False otherwise (it changed
        meanwhile, and the caller reads it again)."""
        ...

    def expire_approval(self, approval_id: str) -> None:
        """Record that a pending approval's deadline passed (it is read as `expired` from then on anyway)."""
        ...

    def void_approval(self, approval_id: str, reason: str = "") -> None:
        """Mark a pending approval void (it will never be used); no-op otherwise."""
        ...

    def wait_for_answer(self, approval_id: str, timeout_s: float) -> PendingApproval:
        """Block until the approval is no longer pending or `timeout_s` passes; return it as it is then.

        `timeout_s == 0` only reads it. SQLite polls; PostgreSQL waits on LISTEN/NOTIFY.
        """
        ...

    # -- lifecycle --------------------------------------------------------------------------------

    def close(self) -> None:
        """Release connections; the store is unusable afterwards."""
        ...


def register_scheme(scheme: str, factory: Callable[[str], RunStore]) -> None:
    """Make `RunStore.open` hand URLs of `scheme` (``"postgresql"``) to `factory(url)` (`proctor.backends`)."""
    backends.register("store", scheme, factory)


