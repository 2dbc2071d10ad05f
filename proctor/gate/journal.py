"""The gate's side of a durable run: each call of a step journaled, and a resumed step answered from it.

A `StepJournal` is set on a `RunContext` (`ctx.journal`) for the step being run. The
gate numbers the step's calls (`take`), gives each a call id that is the same every
time the step runs (`call_id`), and at three points hands the call to this module:

- after the arguments are validated, `replay` compares the call with the journal
  entry at its number. Same tool and argument digest → the recorded result (or
  refusal) is returned without running anything (`call_replayed` in the audit).
  Another tool or other arguments → `ReplayDiverged`, which stops the program. An
  entry that is only an *intent* (the process died while the tool ran) → the program
  gets ``ToolOutcomeUnknown("outcome unknown after a crash")`` (a ToolFailed), unless the policy declares
  the tool ``idempotent: true``, when it simply runs again. An entry that is the call
  the run *suspended* at goes on live, to its answer, when the same call reaches it
  (another call there diverges). Past the end of the journal the call goes on live;
- before the tool runs (after the audit intent), `write_intent` makes the intent
  durable in the store; if it cannot, the call is refused;
- after it ran or was refused, `write_outcome` completes the entry (a call the run
  suspends at is written as `suspended`, durably, before the run stops). A call that ran is
  journaled `done` before its audit outcome is written, durably for tools with effects, and
  that outcome then says so (``journaled: true``): a store found holding less afterwards was
  put back, not cut short by a crash (`proctor.store.trail`).

Every entry is sealed (`proctor.store.seal`) with the run's audit-trail key: a resume
believes no entry it did not write.

A *quiet* journal re-runs an earlier step only to rebuild the program's namespace
in a fresh worker: every call must come from the journal (a new one is divergence),
and nothing is added to the run's history or budgets (they are restored as saved).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from proctor import errors as _errors
from proctor.approval.base import Grant
from proctor.calls import CallRecord, Decision
from proctor.canonical import canonical_sha256
from proctor.errors import (
    BudgetExceeded,
    CallRefused,
    ProctorError,
    ReplayDiverged,
    RunSuspended,
    StepInterrupted,
    StoreError,
    ToolFailed,
    ToolOutcomeUnknown,
)
from proctor.interpreter.channel import EncodeError, ProtocolError, decode_value, encode_value
from proctor.store.base import JournalEntry, RunStore
from proctor.store.seal import StoreSeal
from proctor.telemetry.logging import get_logger

if TYPE_CHECKING:
    from proctor.gate.call import CallOutcome, InFlight
    from proctor.gate.gate import Gate
    from proctor.gate.recorder import Recorder

__all__ = ["StepJournal", "args_digest", "error_from_dict", "error_to_dict", "record_from_dict"]

log = get_logger("proctor.gate.journal")

#: What a program gets at a call whose outcome a crash lost (the tool may or may not have run).
OUTCOME_UNKNOWN = "outcome unknown after a crash"


def args_digest(args: Mapping[str, Any]) -> str:
    """The canonical sha256 of validated arguments (a repr digest for values JSON cannot hold)."""
    try:
        return canonical_sha256(dict(args))
    except (TypeError, ValueError):
        return "repr:" + hashlib.sha256(repr(sorted(args.items())).encode()).hexdigest()


def error_to_dict(error: ProctorError) -> dict[str, Any]:
    out: dict[str, Any] = {"type": type(error).__name__, "message": str(error)}
    if isinstance(error, BudgetExceeded) and error.budget:
        out["budget"] = error.budget
    if isinstance(error, ToolFailed) and error.error_type:
        out["error_type"] = error.error_type
    if isinstance(error, CallRefused) and error.rules:
        out["rules"] = list(error.rules)
    return out


def error_from_dict(data: Mapping[str, Any], *, tool: str, call_id: str) -> ProctorError:
    """Rebuild a journaled error as the same class (refusals and ToolFailed), for the program to catch."""
    cls = getattr(_errors, str(data.get("type", "")), None)
    message = str(data.get("message", ""))
    if isinstance(cls, type) and issubclass(cls, ToolFailed):  # ToolOutcomeUnknown, MCPToolFailed too
        return cls(message, tool=tool, call_id=call_id, error_type=str(data.get("error_type", "")))
    if cls is BudgetExceeded:
        return BudgetExceeded(message, tool=tool, call_id=call_id, rules=tuple(data.get("rules", ())),
                              budget=str(data.get("budget", "")))
    if isinstance(cls, type) and issubclass(cls, _errors.CallRefused):
        return cls(message, tool=tool, call_id=call_id, rules=tuple(data.get("rules", ())))
    return ToolFailed(message, tool=tool, call_id=call_id, error_type=str(data.get("type", "")))


def record_from_dict(data: Mapping[str, Any]) -> CallRecord:
    d = data.get("decision")
    decision = Decision(d["outcome"], tuple(d["rules"]), d["reason"], d["policy_sha256"]) if d else None
    return CallRecord(data["call_id"], data["tool"], dict(data.get("args") or {}), data["side_effect"], decision,
                      data["status"], int(data.get("duration_ns") or 0), data.get("error"), data.get("error_type"),
                      data.get("approval"), data.get("budget"))


class StepJournal:
    """One step's journal as the gate uses it (see the module docstring)."""

    def __init__(self, store: RunStore, run_id: str, step: int, entries: Sequence[JournalEntry] = (), *,
                 quiet: bool = False, idempotent: Callable[[str], bool] = lambda tool: False,
                 seal: StoreSeal | None = None, owner: str | None = None) -> None:
        self.store, self.run_id, self.step, self.quiet = store, run_id, step, quiet
        #: The claim this process holds the run by: an entry is written only while it still does (a process
        #: whose lease ran out and whose run was taken over runs nothing more of it: `RunStore.journal_write`).
        self.owner = owner
        #: Seals each entry written (`proctor.store.seal`): a resume believes only sealed entries.
        self.seal = seal
        self.idempotent = idempotent
        self._entries = {e.seq: e for e in entries}
        self._next = 0
        self._written = 0
        self._lock = threading.Lock()
        self._tag = run_id.removeprefix("run_")
        #: How many calls were answered from the journal; the divergence that stopped the step, if one did.
        self.replayed = 0
        self.diverged: ReplayDiverged | None = None
        # Replayed calls are recorded in one `call_replayed` audit record per stretch (see `flush`).
        self._batch: list[dict[str, Any]] = []
        self._recorder: Recorder | None = None
        #: The `random` seed the step's program runs with (set by the agent), or None.
        self.seed: int | None = None

    def count(self) -> int:
        """How many entries the step's journal holds (what the run record seals at a save)."""
        with self._lock:
            return max(self._written, self.recorded)

    def _write(self, entry: JournalEntry, *, durable: bool) -> None:
        """Write one entry, sealed (StoreError if the store refuses it)."""
        if self.seal is not None:
            entry = replace(entry, ts_ns=entry.ts_ns or time.time_ns())  # sealed as the store keeps it
            entry = replace(entry, seal=self.seal.seal_entry(entry))
        self.store.journal_write(entry, durable=durable, owner=self.owner)
        with self._lock:
            self._written = max(self._written, entry.seq + 1)

    @property
    def recorded(self) -> int:
        """How many calls the journal held when the step started."""
        return len(self._entries)

    def take(self) -> int:
        """The next call's number in the step."""
        with self._lock:
            seq = self._next
            self._next += 1
            return seq

    def call_id(self, seq: int) -> str:
        """The id of the step's call number `seq`: the same each time the step runs."""
        return f"call_{self._tag}_{self.step}_{seq}"

    # -- replay -----------------------------------------------------------------------------------

    def replay(self, gate: Gate, p: InFlight) -> CallOutcome | None:
        """The outcome of call `p` from the journal, or None when it should run live."""
        entry = self._entries.get(p.seq)
        name = p.name
        self._recorder = gate.recorder
        if entry is None:
            if not self.quiet:
                self.flush()  # what was replayed is recorded before the first live call
                return None
            return self._diverge(p, f"the program made a call ({name}) that it did not make when step "
                                    f"{self.step} first ran")
        digest = args_digest(p.args)
        if entry.tool != name or entry.args_digest != digest:
            what = f"{name} instead of {entry.tool}" if entry.tool != name else f"{name} with other arguments"
            return self._diverge(p, f"call {p.seq + 1} of step {self.step} went another way than when the "
                                    f"step first ran: {what}")
        if entry.state == "suspended":  # the call the run stopped at: the same one goes on live, to its answer
            if not self.quiet:
                self.flush()
                return None
            return self._diverge(p, f"call {p.seq + 1} of step {self.step} waited for an approval when the step "
                                    "first ran, and a finished step cannot wait")
        if entry.state == "intent":
            if self.idempotent(name) and not self.quiet:
                log.info("call_rerun_idempotent", tool=name, call_id=p.call_id, run_id=self.run_id)
                self.flush()
                return None
            return self._unknown(p, entry)
        return self._answer(p, entry)

    def _answer(self, p: InFlight, entry: JournalEntry) -> CallOutcome:
        name, status = p.name, entry.status or "failed"
        error: ProctorError | None = None
        value: Any = None
        if entry.error is not None:
            error = error_from_dict(entry.error, tool=name, call_id=p.call_id)
        else:
            try:
                value = decode_value(entry.value)
            except ProtocolError as exc:
                error = ToolFailed(f"{name}: its journaled result cannot be read: {exc}", tool=name,
                                   call_id=p.call_id, error_type="JournalError")
        record = record_from_dict(entry.record) if entry.record else CallRecord(
            p.call_id, name, {}, p.side_effect, None, status, 0, str(error) if error else None)  # type: ignore[arg-type]
        self._apply(p, entry, record)
        self._batch.append({"call_seq": p.seq, "call_id": p.call_id, "tool": name, "status": status,
                            "args_digest": entry.args_digest, "error": str(error) if error else None})
        self.replayed += 1
        return self._recorder_of().replayed(p, record, value, error)

    def _unknown(self, p: InFlight, entry: JournalEntry) -> CallOutcome:
        """A call that was running when its process died: never re-run blindly."""
        name = p.name
        error = ToolOutcomeUnknown(f"{name}: {OUTCOME_UNKNOWN}; it may or may not have taken effect (declare the tool "
                           "`idempotent: true` in the policy to re-run it instead)", tool=name, call_id=p.call_id,
                           error_type="OutcomeUnknown")
        record = CallRecord(p.call_id, name, entry.record.get("args", {}) if entry.record else {}, p.side_effect,
                            None, "failed", 0, str(error), "ToolFailed")
        done = JournalEntry(self.run_id, self.step, p.seq, p.call_id, name, entry.args_digest, "done", "failed",
                            None, error_to_dict(error), entry.args, record.as_dict(),
                            {"tool": name, "side_effect": p.side_effect, "decision": "allow", "status": "failed"})
        journaled = effectful(p.side_effect)  # durably, before the log's outcome, as a live call's (write_outcome)
        try:
            self._write(done, durable=journaled)
        except StoreError as exc:
            log.error("journal_write_failed", call_id=p.call_id, error=str(exc))
            journaled = False
        self.flush()
        self._apply(p, done, record)
        # Close the intent the dead process left in the audit trail, then say what happened.
        outcome = self._recorder_of().lost(p, record, error, journaled=journaled)
        self._batch.append({"call_seq": p.seq, "call_id": p.call_id, "tool": name, "status": "failed",
                            "args_digest": entry.args_digest, "error": str(error)})
        self.flush()
        self.replayed += 1
        return outcome

    def _apply(self, p: InFlight, entry: JournalEntry, record: CallRecord) -> None:
        """Put a replayed call back into the run's history, budgets and grants (not for a quiet replay)."""
        if self.quiet:
            return
        row = entry.history or {}
        p.ctx.remember(p.name, p.args, row.get("side_effect", p.side_effect), row.get("decision", "allow"),
                       record.status, record, labels=p.facts.labels)
        if entry.grant:
            p.ctx.add_grant(Grant.from_dict(entry.grant))
        if record.status in ("ok", "failed", "timeout"):  # it ran: counted again, never refused now
            # run budgets only: shared pools (principal, global…) counted it when it ran
            p.ctx.ledger.replay(p.name, p.side_effect, p.facts.cost, record.duration_ns)

    def _where(self, p: InFlight) -> dict[str, Any]:
        return {"run_id": self.run_id, "step": self.step, "call_seq": p.seq, "call_id": p.call_id}

    def _recorder_of(self) -> Recorder:
        assert self._recorder is not None, "replay() sets the recorder before any ending"
        return self._recorder

    def flush(self) -> None:
        """Record the calls replayed since the last flush as one `call_replayed` audit record.

        Called before the first live call, on divergence, and by the agent when the step ends."""
        if not self._batch or self._recorder is None:
            return
        batch, self._batch = self._batch, []
        self._recorder.append("call_replayed", {"run_id": self.run_id, "step": self.step, "quiet": self.quiet,
                                                "calls": batch}, durable=False)

    def _diverge(self, p: InFlight, message: str) -> CallOutcome:
        name = p.name
        self.flush()
        error = ReplayDiverged(f"{message}; the step was stopped so that nothing runs twice", tool=name,
                               call_id=p.call_id)
        self.diverged = self.diverged or error
        expected = self._entries[p.seq].tool if p.seq in self._entries else None
        return self._recorder_of().diverged(p, error, {**self._where(p), "tool": name,
                                                       "args_digest": args_digest(p.args), "error": str(error),
                                                       "expected": expected})

    # -- live calls -------------------------------------------------------------------------------

    def write_intent(self, p: InFlight) -> str | None:
        """Make the call's intent durable; the reason it could not be, or None."""
        known = self._entries.get(p.seq)
        if known is not None and known.state == "done":
            return f"call {p.seq + 1} of step {self.step} is already recorded as done"
        try:
            self._write(JournalEntry(self.run_id, self.step, p.seq, p.call_id, p.name,
                                                  args_digest(p.args), "intent", args=_encode(p.args)),
                                     durable=effectful(p.side_effect))
        except StoreError as exc:
            return str(exc)
        return None

    def write_outcome(self, p: InFlight, status: str, value: Any, error: ProctorError | None,
                      record: CallRecord) -> bool:
        """Complete the call's entry (refused calls too). A call the run suspends at is journaled as
        `suspended` (tool, argument digest, its place in the step), durably, before the run stops: a
        resumed program must reach the same call there, or it diverges. Another interruption (a
        divergence, a cancelled step) leaves no entry.

        An entry the step found complete is never overwritten (a call that ran stays recorded).

        True when the call's `done` entry is on stable storage: then the audit outcome the recorder writes
        next says so (``journaled``), and a store that has the call as anything but done after that record
        was put back (`proctor.store.trail`). Written durably for tools with effects only, as the intent is:
        a read's `done` may be lost by a power cut after the log's outcome is on disk, honestly."""
        if p.seq < 0 or (isinstance(error, StepInterrupted) and not isinstance(error, RunSuspended)):
            return False
        known = self._entries.get(p.seq)
        if known is not None and known.state == "done":
            return False
        if isinstance(error, RunSuspended):
            try:
                self._write(JournalEntry(self.run_id, self.step, p.seq, p.call_id, p.name,
                                                      args_digest(p.args), "suspended", args=_encode(p.args),
                                                      ts_ns=time.time_ns()), durable=True)
            except StoreError as exc:  # resume then finds no entry where the run stopped, and refuses
                log.error("journal_write_failed", call_id=p.call_id, error=str(exc))
            return False
        encoded: Any = None
        err = error_to_dict(error) if error is not None else None
        if err is None:
            try:
                encoded = encode_value(value, "result")
            except EncodeError as exc:
                try:  # an image result is kept as its encoded bytes; the resumed run shows it again
                    from proctor.images import freeze_images

                    encoded = encode_value(freeze_images(value), "result")
                except (EncodeError, ImportError):
                    err = {"type": "ToolFailed", "message": f"{p.name}: ran, but its {exc}",
                           "error_type": "EncodeError"}
        grant = p.approval.grant.as_dict() if p.approval is not None and p.approval.grant is not None else None
        entry = JournalEntry(self.run_id, self.step, p.seq, p.call_id, p.name, args_digest(p.args), "done",
                             status, encoded, err, _encode(p.args), record.as_dict(),
                             {"tool": p.name, "side_effect": p.side_effect,
                              "decision": p.decision.outcome if p.decision else "deny", "status": status},
                             grant, time.time_ns())
        durable = effectful(p.side_effect)
        try:
            self._write(entry, durable=durable)
        except StoreError as exc:  # the log's outcome then says nothing of the journal: a resume finds the intent
            log.error("journal_write_failed", call_id=p.call_id, error=str(exc))
            return False
        return durable


def effectful(side_effect: str) -> bool:
    """Whether a call's journal entries are written durably (fsynced): a tool with effects'."""
    return side_effect not in ("none", "read")


def _encode(args: Mapping[str, Any]) -> dict[str, Any]:
    try:
        out: dict[str, Any] = encode_value(dict(args), "args")
        return out
    except EncodeError:
        return {}
