"""What an agent with a run store does at each point of a run, so the run can stop and go on elsewhere.

- start: the run is created in the store (task, principal, labels, policy fingerprint,
  a seed, the trace to link to) and claimed by this process;
- each action step: the state at its start is saved (messages, finished steps,
  history, budgets used, grants) and the step gets a journal (`StepJournal`); the
  model's answer is saved before it is acted on, so a resume re-runs the same program;
- a call waiting for an approval suspends the run (status ``suspended``, the approvals
  it waits for); an ending is saved with the answer or error.

`resume` reads it back: the run is claimed (a run still marked ``running`` whose process
died on this host is taken over at once; one elsewhere when its lease runs out), the
state restored, and the step in progress re-run with its journal.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proctor.agent.models import ModelResponse, ToolCallRequest, Usage
from proctor.agent.result import StepRecord
from proctor.approval.base import Grant
from proctor.calls import CallRecord, new_id
from proctor.errors import RunCancelled, RunTakenOver, StoreConflict, StoreError, StoreForged
from proctor.gate.journal import StepJournal, record_from_dict
from proctor.gate.run import RunContext
from proctor.interpreter.channel import EncodeError, ProtocolError, decode_value, encode_value
from proctor.store.base import JournalEntry, PendingApproval, RunRecord, RunStore
from proctor.store.seal import StoreSeal
from proctor.telemetry.logging import get_logger

__all__ = ["DurableRun", "response_from_dict", "response_to_dict", "step_from_dict"]

log = get_logger("proctor.agent.durable")

#: How long a claim on a run lasts without being renewed: its process renews it every third of that while it
#: works on the run (`ClaimKeeper`), a long tool call or a long wait for an answer included, so only a process
#: that stopped (or lost the store) for a whole lease lets another one take the run over.
LEASE_S = 300.0


class ClaimKeeper:
    """Renews one run's claim in the store from a thread of its own until `stop`. A renewal the store refuses
    (another process took the run over) ends it: that process's owner checks then refuse this one's writes."""

    def __init__(self, store: RunStore, run_id: str, owner: str) -> None:
        self.store, self.run_id, self.owner = store, run_id, owner
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep, name=f"proctor-claim-{run_id}", daemon=True)
        self._thread.start()

    def _keep(self) -> None:
        while not self._stop.wait(LEASE_S / 3):
            if not self.renew():
                return

    def renew(self) -> bool:
        """Renew the claim once; False when this process no longer holds the run."""
        try:
            if self.store.claim_run(self.run_id, self.owner, LEASE_S):
                return True
            log.error("run_claim_lost", run_id=self.run_id, owner=self.owner)
            return False
        except Exception as exc:  # noqa: BLE001 - a store that fails now may answer the next renewal
            log.error("run_claim_renewal_failed", run_id=self.run_id, error=repr(exc))
            return True

    def stop(self) -> None:
        self._stop.set()


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{new_id()[:8]}"


def _dead_here(owner: str | None) -> bool:
    """Whether `owner` was a process of this host that no longer exists."""
    if not owner:
        return True
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def step_seed(seed: int, step: int) -> int:
    """The `random` seed of a step's program: the same each time the step runs."""
    return (seed * 1_000_003 + step * 7919) % (2**31 - 1)


def response_to_dict(response: ModelResponse) -> dict[str, Any]:
    return {"content": response.content, "model": response.model, "cost_usd": response.cost_usd,
            "usage": [response.usage.input_tokens, response.usage.output_tokens],
            "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments if isinstance(c.arguments, str)
                            else _encode(c.arguments)} for c in response.tool_calls]}


def response_from_dict(data: Mapping[str, Any]) -> ModelResponse:
    calls = tuple(ToolCallRequest(str(c["id"]), str(c["name"]),
                                  c["arguments"] if isinstance(c["arguments"], str) else _decode(c["arguments"]))
                  for c in data.get("tool_calls") or ())
    usage = data.get("usage") or [0, 0]
    return ModelResponse(str(data.get("content", "")), calls, Usage(int(usage[0]), int(usage[1])),
                         data.get("cost_usd"), str(data.get("model", "")))


def step_from_dict(data: Mapping[str, Any]) -> StepRecord:
    usage = data.get("usage") or {}
    return StepRecord(int(data["number"]), data.get("kind", "action"), data.get("model_output", ""), data.get("code"),
                      data.get("observation", ""), [record_from_dict(c) for c in data.get("tool_calls") or ()],
                      Usage(int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0))),
                      data.get("cost_usd"), data.get("error"), int(data.get("duration_ns", 0)),
                      bool(data.get("final_answer", False)), [dict(i) for i in data.get("images") or ()])


def _encode(value: Any) -> Any:
    try:
        return encode_value(value)
    except EncodeError:
        return repr(value)


def _decode(value: Any) -> Any:
    try:
        return decode_value(value)
    except ProtocolError:
        return value


def snapshot_history(ctx: RunContext) -> list[dict[str, Any]]:
    rows = list(ctx.history_view())
    records = list(ctx.records)
    k = min(len(rows), len(records))  # both keep the run's last calls (bounded by history_limit)
    rows, records = rows[len(rows) - k:], records[len(records) - k:]
    return [{"tool": h.tool, "args": _encode(dict(h.args)), "side_effect": h.side_effect, "decision": h.decision,
             "status": h.status, "labels": list(h.labels), "record": r.as_dict()}
            for h, r in zip(rows, records, strict=False)]


def restore_context(ctx: RunContext, record: RunRecord) -> None:
    """Put the saved history, budgets and grants of `record` (as at its step's start) into `ctx`."""
    if record.history_dropped:
        ctx.restore_dropped(record.history_dropped)
    for row in record.history:
        args = _decode(row.get("args") or {})
        rec: CallRecord = record_from_dict(row["record"])
        ctx.remember(str(row["tool"]), args if isinstance(args, dict) else {}, row["side_effect"],
                     row["decision"], row["status"], rec, labels=tuple(row.get("labels") or ()))
    if record.budgets:
        ctx.ledger.restore(record.budgets)
    for g in record.grants:
        ctx.grants.append(Grant.from_dict(g))


@dataclass
class DurableRun:
    """One run as an agent keeps it in the store (see the module docstring)."""

    store: RunStore
    record: RunRecord
    owner: str
    idempotent: set[str] = field(default_factory=set)
    #: Seals what this run writes to the store (`proctor.store.seal`); None: an agent without an audit trail.
    seal: StoreSeal | None = None
    #: The journal of the step in progress (its entry count is sealed into each save).
    journal: StepJournal | None = None
    #: A resumed run's journals as its resume checked them (step → entries): replayed from, not read again.
    checked: dict[int, list[JournalEntry]] = field(default_factory=dict)
    #: Renews this process's claim while it works on the run; stopped when the run ends or is let go.
    keeper: ClaimKeeper | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.keeper is None:
            self.keeper = ClaimKeeper(self.store, self.record.run_id, self.owner)
            # A run dropped without its end or release (an agent that failed meanwhile) stops being kept.
            weakref.finalize(self, self.keeper.stop)

    # -- starting and resuming --------------------------------------------------------------------

    @classmethod
    def start(cls, store: RunStore, ctx: RunContext, *, task: str, agent: str, policy_sha256: str,
              trace: tuple[str | None, str | None], idempotent: set[str], seal: StoreSeal | None) -> DurableRun:
        owner = _owner()
        seed = int.from_bytes(os.urandom(4), "big")
        record = RunRecord(
            run_id=ctx.info.id, task=task, principal=ctx.info.principal, labels=dict(ctx.info.labels),
            policy_sha256=policy_sha256, agent=agent, seed=seed, trace_id=trace[0], span_id=trace[1], owner=owner,
            created_at_ns=time.time_ns(), audit_start=ctx.audit_start)
        record = store.create_run(record.evolve(seal=seal.seal_record(record)) if seal is not None else record)
        store.claim_run(record.run_id, owner, LEASE_S)
        return cls(store, record, owner, idempotent, seal)

    @classmethod
    def claim(cls, store: RunStore, run_id: str, idempotent: set[str], seal: StoreSeal | None, *,
              checked: tuple[RunRecord, dict[int, list[JournalEntry]]] | None = None) -> DurableRun:
        """Take a suspended run (or a running one whose process died) for this process; StoreError if not possible.

        `checked` is the record and journals the resume checked (`AgentBase._check_resumable`): the run
        claimed must be that record (`StoreForged` if it changed meanwhile), and its steps replay from
        those journals, so nothing written to the store between the check and the claim is believed."""
        record = store.get_run(run_id)
        if record.status not in ("suspended", "running"):
            raise StoreError(f"run {run_id} is {record.status}: there is nothing to resume")
        owner = _owner()
        if not store.claim_run(run_id, owner, LEASE_S):
            if record.status == "running" and _dead_here(record.owner) and record.owner:
                store.release_run(run_id, record.owner)
            if not store.claim_run(run_id, owner, LEASE_S):
                raise StoreConflict(f"run {run_id} is being worked on by {record.owner}; resume it once that "
                                    f"process has ended (or its {LEASE_S:g}s lease has run out)")
        record = store.get_run(run_id)
        if record.status == "cancelled":  # a cancel that landed meanwhile stands (its record keeps the old seal)
            store.release_run(run_id, owner)
            raise RunCancelled(f"run {run_id} was cancelled: {record.error or 'no reason given'}; nothing ran")
        if record.status not in ("suspended", "running"):
            store.release_run(run_id, owner)
            raise StoreError(f"run {run_id} is {record.status}: there is nothing to resume")
        if checked is not None and record.seal != checked[0].seal:
            store.release_run(run_id, owner)
            raise StoreForged(f"resume refused: run {run_id} changed in the store while it was checked; nothing ran "
                              "(resume it again)")
        durable = cls(store, record, owner, idempotent, seal)
        if checked is not None:
            durable.checked = dict(checked[1])
        try:
            durable.record = store.save_run(durable.sealed(record.evolve(status="running", owner=owner)))
        except BaseException:
            durable.release()
            raise
        return durable

    # -- during the run ---------------------------------------------------------------------------

    def step_started(self, ctx: RunContext, number: int, memory: Sequence[Mapping[str, Any]],
                     steps: Sequence[StepRecord], *, resuming: bool) -> StepJournal:
        """Save the state at the start of step `number` and give the step its journal."""
        entries: list[JournalEntry] = []
        if resuming:
            entries = self._journal(number)
        else:
            self._save(step=number, messages=[dict(m) for m in memory], steps=[s.as_dict() for s in steps],
                       history=(history := snapshot_history(ctx)), history_dropped=ctx.calls_made - len(history),
                       budgets=ctx.ledger.snapshot(),
                       grants=[g.as_dict() for g in ctx.grants], step_state=None, status="running")
        journal = StepJournal(self.store, self.record.run_id, number, entries,
                              idempotent=lambda tool: tool in self.idempotent, seal=self.seal, owner=self.owner)
        journal.seed = step_seed(self.record.seed, number)
        ctx.journal = self.journal = journal
        self.store.claim_run(self.record.run_id, self.owner, LEASE_S)
        return journal

    def responded(self, response: ModelResponse) -> None:
        """The model's answer for the step in progress: saved before any of it is acted on."""
        self._save(step_state={"response": response_to_dict(response)})

    def saved_response(self) -> ModelResponse | None:
        state = self.record.step_state or {}
        data = state.get("response")
        return response_from_dict(data) if isinstance(data, Mapping) else None

    def replay_journal(self, step: int) -> StepJournal:
        """A quiet journal for re-running earlier step `step` (rebuilding the program's namespace)."""
        journal = StepJournal(self.store, self.record.run_id, step, self._journal(step), quiet=True, seal=self.seal,
                              owner=self.owner)
        journal.seed = step_seed(self.record.seed, step)
        return journal

    def _journal(self, step: int) -> list[JournalEntry]:
        """Step `step`'s journal: as the resume checked it, once; read from the store otherwise."""
        checked = self.checked.pop(step, None)
        return checked if checked is not None else self.store.journal(self.record.run_id, step)

    def pending_for(self, calls: Sequence[CallRecord]) -> list[PendingApproval]:
        """The approvals the suspended calls among `calls` wait for."""
        waiting = {c.call_id for c in calls if c.error_type == "RunSuspended"}
        if not waiting:
            return []
        return [a for a in self.store.list_approvals(status="pending", run_id=self.record.run_id)
                if a.call_id in waiting]

    # -- endings ----------------------------------------------------------------------------------

    def end(self, status: str, *, answer: Any, error: str | None, steps: Sequence[StepRecord],
            pending: Sequence[PendingApproval]) -> None:
        """Save how the run ended (or that it is suspended) and let go of it."""
        try:
            if status == "suspended":
                self._save(status="suspended", pending=[a.id for a in pending], error=error)
            else:
                try:
                    encoded = encode_value(answer)
                except EncodeError:
                    encoded = repr(answer)
                self._save(status=status if status in ("done", "max_steps", "budget_exhausted", "cancelled")
                           else "error", answer=encoded, error=error, steps=[s.as_dict() for s in steps],
                           pending=[], step_state=None)
        except StoreError as exc:
            log.error("run_store_save_failed", run_id=self.record.run_id, error=str(exc))
        finally:
            self._stop_keeping()
            try:
                self.store.release_run(self.record.run_id, self.owner)
            except StoreError as exc:
                log.error("run_store_release_failed", run_id=self.record.run_id, error=str(exc))

    def _stop_keeping(self) -> None:
        if self.keeper is not None:
            self.keeper.stop()

    def release(self) -> None:
        """Let go of the run without changing it (an interrupted process: resume takes it up as after a crash)."""
        self._stop_keeping()
        try:
            self.store.release_run(self.record.run_id, self.owner)
        except StoreError as exc:
            log.error("run_store_release_failed", run_id=self.record.run_id, error=str(exc))

    def sealed(self, record: RunRecord) -> RunRecord:
        """`record` with the entry count of the step in progress and its seal (unchanged without a seal)."""
        if self.seal is None:
            return record
        heads = dict(record.journal_heads)
        if self.journal is not None:
            heads[str(self.journal.step)] = {"count": self.journal.count()}
        record = record.evolve(journal_heads=heads)
        return record.evolve(seal=self.seal.seal_record(record))

    def _save(self, **changes: Any) -> None:
        try:
            self.record = self.store.save_run(self.sealed(self.record.evolve(**changes)))
        except StoreConflict:
            # Someone else saved it: a cancel wins; another process that took the run over (this one's lease ran
            # out) owns it now, and nothing of this one's is written over what that one saved.
            current = self.store.get_run(self.record.run_id)
            if current.status == "cancelled":
                self.record = current
                raise RunCancelled(f"run {current.run_id} was cancelled: {current.error or 'no reason given'}"
                                   ) from None
            if current.owner != self.owner:
                raise RunTakenOver(f"run {current.run_id}: this process no longer holds it ({current.owner} took "
                                    "it over after this process's lease ran out): nothing more of it is written "
                                    "or run here") from None
            self.record = self.store.save_run(self.sealed(current.evolve(**changes)))

