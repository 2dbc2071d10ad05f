"""A run store checked against its audit trail: what the log recorded of each run, and where the store disagrees.

The seals (`proctor.store.seal`) prove that what the store holds was written by the run; they cannot
prove it is the *latest* thing the run wrote. Whoever can write the store could put back an earlier
sealed version of a journal entry or of the whole run: a call journaled ``suspended`` again after it
ran, so that a resume runs it a second time, or a run set back to a step it had finished. The audit
trail is the clock the store cannot turn back: it is append-only, hash-chained, and the store's writers
cannot write it. Every version a run writes of an entry comes after the entry's previous version in
the trail's order, and the trail records the moments that matter — a call's live ``call_intent``,
written after its journal intent and before its tool runs, and its ``call_outcome``, written after its
journal ``done`` (and saying ``journaled`` when that was on stable storage first). So:

- `behind_trail` is what a resume checks (`AgentBase._check_sealed`), before anything runs: no call the
  trail records as started may be journaled as waiting for its approval, or be missing, or belong to
  a step later than the saved run's; no call whose outcome the trail records as journaled may be
  journaled as anything but done; no run the trail records as finished may be resumable;
- `check_store` is what ``proctor audit verify LOG --store URL`` reports: the same, every seal (answers'
  included: `proctor.store.answerseal`), and every other disagreement between the store and the log
  (grants and answers no ``approval_resolved`` gave, calls journaled as done that the log never saw end, and the reverse
  for finished runs, statuses that are not the log's ``run_finished``).

A run taken over (`RunTakenOver`: another process resumed it after its process's lease ran out, while that
process was still alive) leaves records the store does not match, and is not tampering: the process that lost
the run records its call ending after the takeover (the tool did run to its end), while the journal keeps what
the process that took it over recorded (outcome unknown); its next calls are refused before the store holds
anything of them (``refused_at: "journal"``); its run ends ``interrupted`` with ``taken_over: true``, which is
not the run's ending. Those are reported as `Disagreement` with ``takeover=True`` — what happened, not a
store that was changed — and every check holds as before for the rest (the run's ending is the one that is not
the takeover's).

Both read the records of the log as dicts (`AuditReader.run_records`, or every record of a file);
`read_trail` reads a whole log, file or PostgreSQL, with the secret its seals are keyed by, and
`check_store_against_trail` checks a store with the seals derived from that secret.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proctor.canonical import jsonable
from proctor.store.answerseal import AnswerSeal
from proctor.store.base import JournalEntry, PendingApproval, RunRecord, RunStore
from proctor.store.seal import StoreSeal

__all__ = ["Disagreement", "RunTrail", "behind_trail", "check_store", "check_store_against_trail", "journal_place",
           "read_trail", "trails"]

#: Statuses of `run_finished` after which a run is never resumed (an interrupted run is taken up again).
FINAL = frozenset({"done", "max_steps", "budget_exhausted", "error", "cancelled"})
#: Journal states at or past a call's start (its journal intent is written before its audit intent).
STARTED = frozenset({"intent", "done"})


@dataclass(frozen=True)
class Disagreement:
    """One thing the store and the log do not agree on: which run, which entry of it, and what."""

    run_id: str
    entry: str
    message: str
    #: What the log itself shows to be a takeover of the run (its earlier process went on after another took it
    #: over), not a store that was changed: reported apart (``proctor audit verify --store`` does not fail on it).
    takeover: bool = False

    def line(self) -> str:
        return f"run {self.run_id}, {self.entry}: {'taken over: ' if self.takeover else ''}{self.message}"

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "entry": self.entry, "message": self.message, "takeover": self.takeover}


@dataclass
class RunTrail:
    """What the audit trail recorded of one run's own calls (a managed agent's are not journaled)."""

    run_id: str
    #: call id → the call's live `call_intent` (the one written right before its tool ran).
    started: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    #: call id → the statuses of its `call_outcome` records, in order.
    outcomes: dict[str, list[str]] = field(default_factory=dict)
    #: call id → its `call_outcome` records, in order.
    outcome_records: dict[str, list[Mapping[str, Any]]] = field(default_factory=dict)
    #: Call ids refused because the run store could not record them (``refused_at: "journal"``): never journaled.
    unjournaled: set[str] = field(default_factory=set)
    #: The seqs of the run's `run_resumed` records, in order.
    resumed: list[int] = field(default_factory=list)
    #: The `run_finished` records of processes whose run another took over (``taken_over: true``): not endings.
    taken_over: list[Mapping[str, Any]] = field(default_factory=list)
    #: The `run_finished` records that say ``taken_over: true`` with no `run_resumed` of the run in the log after
    #: the one that opened their process's work on it (``opened_seq``): the process stopped on the store's word
    #: that another had taken the run over (its owner, which the store's writers can change), and no other
    #: process's resume shows it. Each is a disagreement, and the run's ending as any other.
    unshown_takeovers: list[Mapping[str, Any]] = field(default_factory=list)
    #: call id → its `call_outcome` written after the journal's `done` for it was on stable storage
    #: (``journaled: true``, `Recorder.finished`): the store cannot honestly hold less for that call.
    journaled: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    #: Call ids whose intent the log's reopening closed `unknown` (its writer stopped first: a crash).
    recovered: set[str] = field(default_factory=set)
    #: The run's `approval_resolved` records that carry an answer (not the suspensions).
    resolved: list[Mapping[str, Any]] = field(default_factory=list)
    #: The run's last `run_finished`, if any (a taken-over process's is not the run's: `taken_over`).
    finished: Mapping[str, Any] | None = None
    #: (call id, binding) → the deadline (`expires_at_ns`) of the first `approval_requested` for them: the one its
    #: approval was filed with (a resumed run asking again finds that approval, deadline and all; a changed policy
    #: voids it and files another, under another binding).
    deadlines: dict[tuple[str, str], int] = field(default_factory=dict)
    #: (call id, binding) → the first `approval_requested` for them: the call as it was asked about (its `args` as
    #: the log holds them), which its approval in the store must show its answerers.
    asked: dict[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)

    def note(self, rec: Mapping[str, Any]) -> None:
        kind, call_id = rec.get("kind"), rec.get("call_id")
        if kind == "run_finished":
            if rec.get("taken_over") is not True:
                self.finished = rec
            elif self._resumed_since(rec.get("opened_seq"), rec.get("seq")):
                self.taken_over.append(rec)
            else:
                self.unshown_takeovers.append(rec)
                self.finished = rec
        elif kind == "run_resumed":
            seq = rec.get("seq")
            if isinstance(seq, int) and not isinstance(seq, bool):
                self.resumed.append(seq)
        elif "parent_call_id" in rec or not isinstance(call_id, str):
            return
        elif kind == "call_intent" and "error" not in rec:  # a refused call's intent carries its refusal
            self.started[call_id] = rec
        elif kind == "call_intent" and rec.get("refused_at") == "journal":
            self.unjournaled.add(call_id)
        elif kind == "call_outcome":
            self.outcomes.setdefault(call_id, []).append(str(rec.get("status")))
            self.outcome_records.setdefault(call_id, []).append(rec)
            if rec.get("journaled") is True:
                self.journaled[call_id] = rec
            elif "intent_seq" in rec and rec.get("status") == "unknown":
                self.recovered.add(call_id)
        elif kind == "approval_resolved" and rec.get("verdict") not in (None, "suspended"):
            self.resolved.append(rec)
        elif kind == "approval_requested":
            expires, binding = rec.get("expires_at_ns"), rec.get("binding")
            if isinstance(expires, int) and not isinstance(expires, bool) and isinstance(binding, str):
                self.deadlines.setdefault((call_id, binding), expires)
            if isinstance(binding, str):
                self.asked.setdefault((call_id, binding), rec)


    def _resumed_since(self, opened: object, ended: object) -> bool:
        """Whether the log holds a `run_resumed` of the run between seq `opened` (what opened a process's work on
        it) and seq `ended` (its `run_finished`): another process's resume, which a takeover is."""
        if not isinstance(opened, int) or not isinstance(ended, int) or isinstance(opened, bool) \
                or isinstance(ended, bool):
            return False
        return any(opened < r < ended for r in self.resumed)


def trails(records: Iterable[Mapping[str, Any]], run_id: str | None = None) -> dict[str, RunTrail]:
    """The trail of every run the records name (only `run_id`'s, when given)."""
    out: dict[str, RunTrail] = {}
    for rec in records:
        rid = rec.get("run_id")
        if not isinstance(rid, str) or (run_id is not None and rid != run_id):
            continue
        trail = out.get(rid)
        if trail is None:
            trail = out[rid] = RunTrail(rid)
        trail.note(rec)
    return out


def journal_place(run_id: str, call_id: str) -> tuple[int, int] | None:
    """(step, seq) of a call id a run's journal gave (`StepJournal.call_id`), or None for another call."""
    prefix = f"call_{run_id.removeprefix('run_')}_"
    if not call_id.startswith(prefix):
        return None
    step, _, seq = call_id[len(prefix):].partition("_")
    if not (step.isdigit() and seq.isdigit()):
        return None
    return int(step), int(seq)


def _when(ns: int) -> str:
    return _dt.datetime.fromtimestamp(ns / 1e9, tz=_dt.timezone.utc).isoformat(timespec="milliseconds")


def _where(step: int, seq: int, tool: object) -> str:
    return f"step {step}, journal entry {seq} ({tool})"


def behind_trail(record: RunRecord, journals: Mapping[int, Sequence[JournalEntry]],
                 trail: RunTrail | None, approvals: Sequence[PendingApproval] = ()) -> list[Disagreement]:
    """Where the store is behind what the trail recorded of the run: an earlier version put back, an approval the
    run waits for deleted, or an approval's deadline moved later than the one the trail recorded when the call was
    asked about.

    `journals` are the step journals read from the store (step → entries), `approvals` the run's approvals
    there. Each problem names the run and the entry; resuming past any of them could run a call a second
    time, or on an answer the policy's timeout refused."""
    if trail is None:
        return []
    run_id, out = record.run_id, []
    held = {a.id for a in approvals}
    for missing in (i for i in record.pending if i not in held):  # (the run record names them, sealed)
        out.append(Disagreement(run_id, f"approval {missing}", (
            "the run waits for it, but the store does not hold it: it was deleted (a store never removes an "
            "approval); resuming would ask for the call again, with a new deadline, and lose whatever answer it "
            f"had: cancel the run (proctor runs cancel {run_id})")))
    for a in approvals:
        asked = trail.deadlines.get((a.call_id, a.binding))
        if asked is not None and (a.expires_at_ns is None or a.expires_at_ns > asked):
            moved = "no deadline" if a.expires_at_ns is None else f"the deadline {_when(a.expires_at_ns)}"
            out.append(Disagreement(run_id, f"approval {a.id} ({a.tool})", (
                f"the store gives it {moved}, but the audit trail recorded {_when(asked)} when the call was asked "
                "about: the deadline was moved in the store; an answer after the policy's timeout would be taken")))
    if trail.finished is not None and trail.finished.get("status") in FINAL and record.status in ("suspended",
                                                                                                  "running"):
        out.append(Disagreement(run_id, "run record", (
            f"the store has the run {record.status}, but the audit trail records it finished "
            f"({trail.finished.get('status')}, seq {trail.finished.get('seq')}): an earlier version of the run was "
            "put back into the store")))
    for call_id, intent in trail.started.items():
        place = journal_place(run_id, call_id)
        if place is None:
            continue
        step, seq = place
        tool, at = intent.get("tool"), intent.get("seq")
        if step > record.step:
            out.append(Disagreement(run_id, _where(step, seq, tool), (
                f"the audit trail records the call as started (seq {at}), but the store's run is at step "
                f"{record.step}: an earlier version of the run was put back into the store")))
            continue
        entries = journals.get(step)
        if entries is None:
            continue
        entry = entries[seq] if seq < len(entries) and entries[seq].seq == seq else None
        if entry is None:
            out.append(Disagreement(run_id, _where(step, seq, tool), (
                f"missing from the journal, but the audit trail records the call as started (seq {at}): the entry "
                "was dropped, or the store lost a write it had acknowledged")))
        elif entry.state not in STARTED:
            out.append(Disagreement(run_id, _where(step, seq, entry.tool), (
                f"journaled as {entry.state}, but the audit trail records the call as started after that (seq "
                f"{at}): an earlier version of the entry was put back into the store; resuming it would run the "
                "call again")))
    # The journal's `done` of a call that ran is on stable storage before its outcome is written to the log,
    # which then says so: the store holding less for it is an earlier version put back (or a store that lost
    # a write it had acknowledged), never a crash between the two writes.
    for call_id, outcome in trail.journaled.items():
        place = journal_place(run_id, call_id)
        if place is None or place[0] > record.step:
            continue  # (a later step than the run's: reported above, from the call's intent)
        step, seq = place
        entries = journals.get(step)
        entry = entries[seq] if entries is not None and seq < len(entries) and entries[seq].seq == seq else None
        if entry is not None and entry.state != "done":
            out.append(Disagreement(run_id, _where(step, seq, entry.tool), (
                f"journaled as {entry.state}, but the audit trail records the call as ended "
                f"{outcome.get('status')} after the store had it done (seq {outcome.get('seq')}): an earlier "
                "version of the entry was put back into the store, or the store lost a write it had acknowledged")))
    return out


def check_store(store: RunStore, seal: StoreSeal, records: Iterable[Mapping[str, Any]],
                *, runs: Sequence[RunRecord] | None = None, answers: AnswerSeal | None = None
                ) -> tuple[list[Disagreement], dict[str, int]]:
    """Every disagreement between `store` and the log whose records are `records`, and what was checked.

    `seal` is the log's store seal (its sink's `key_for("run-store")`), `answers` its answer seal
    (`key_for("approval-answers")`: every answer the store holds must carry one that holds). Runs are the
    store's (all of them, unless `runs` names some); the log may hold other stores' runs too, which are
    not looked at."""
    by_run = trails(records)
    counted = {"runs": 0, "entries": 0, "approvals": 0}
    out: list[Disagreement] = []
    for record in runs if runs is not None else _all_runs(store):
        trail = by_run.get(record.run_id) or RunTrail(record.run_id)
        last = max([record.step, *(p[0] for c in trail.started if (p := journal_place(record.run_id, c)))])
        journals = {step: store.journal(record.run_id, step) for step in range(1, last + 1)}
        counted["runs"] += 1
        counted["entries"] += sum(len(e) for e in journals.values())
        approvals = store.list_approvals(status=None, run_id=record.run_id)
        counted["approvals"] += len(approvals)
        out.extend(_run_disagreements(record, journals, trail, approvals, seal))
        if answers is not None:
            out.extend(_answer_seal_disagreements(record.run_id, approvals, answers))
    return out, counted


def read_trail(log: str) -> tuple[list[dict[str, Any]], bytes]:
    """Every record of the audit trail `log`, a file or a ``postgresql://`` log (exported as the file
    verifier reads it), and the trail's secret, which the store's seals and answers are keyed by.

    Raises AuditError when the trail cannot be read as one, or when a file log's secret, kept beside it
    in ``LOG.redact-key``, is not there; OSError when the file cannot be read at all."""
    import tempfile
    from pathlib import Path

    from proctor.audit.lines import read_records
    from proctor.errors import AuditError

    if log.startswith(("postgresql://", "postgres://")):
        from proctor.audit.postgres import export_jsonl, redaction_secret

        secret = redaction_secret(log)
        with tempfile.TemporaryDirectory(prefix="proctor-verify-") as tmp:
            path = Path(tmp) / "audit.jsonl"
            with path.open("wb") as out:
                export_jsonl(log, out)
            records, _ = read_records(path)
        return records, secret
    key_file = Path(log + ".redact-key")
    if not key_file.is_file():
        raise AuditError(f"{key_file}: no such file: the store's seals are keyed by the log's secret, kept there "
                         "(copy it beside the log to check a store)")
    secret = key_file.read_bytes()
    records, _ = read_records(log)
    return records, secret


def check_store_against_trail(store: RunStore, records: Iterable[Mapping[str, Any]], secret: bytes
                              ) -> tuple[list[Disagreement], dict[str, int]]:
    """`check_store` of `store` against a trail's `records`, its store seal and answer seal derived from the
    trail's `secret` (both as `read_trail` gives them): what ``proctor audit verify LOG --store URL`` reports."""
    from proctor.audit.base import derive_key
    from proctor.store.seal import PURPOSE

    return check_store(store, StoreSeal(derive_key(secret, PURPOSE)), records, answers=AnswerSeal.of_secret(secret))


def _answer_seal_disagreements(run_id: str, approvals: Sequence[PendingApproval],
                               answers: AnswerSeal) -> list[Disagreement]:
    """Answers whose seal does not hold: no answerer gave them (the gate refuses them when it reads them)."""
    out = []
    for a in approvals:
        problem = answers.problem(a) if a.answer is not None else None
        if problem is not None:
            why = problem.removeprefix(f"approval {a.id} ({a.tool} of run {run_id}): ")
            out.append(Disagreement(run_id, f"approval {a.id} ({a.tool})", why.partition("; refused")[0]))
    return out


def _all_runs(store: RunStore) -> list[RunRecord]:
    return store.list_runs(limit=2**31 - 1)


def _seal_disagreements(record: RunRecord, journals: Mapping[int, Sequence[JournalEntry]],
                        seal: StoreSeal) -> list[Disagreement]:
    run_id, out = record.run_id, []
    if record.status != "cancelled":  # a cancel is the store's own write, never sealed (nor ever resumed)
        problem = seal.record_problem(record)
        if problem is not None:
            out.append(Disagreement(run_id, "run record", problem.removeprefix(f"run {run_id}: ")))
    heads = {} if out else dict(record.journal_heads)
    for step, entries in sorted(journals.items()):
        for problem in seal.journal_problems(run_id, step, entries):
            where, _, why = problem.removeprefix(f"run {run_id}, ").partition(": ")
            out.append(Disagreement(run_id, where, why))
        sealed = heads.get(str(step))
        if sealed is not None and int(sealed.get("count", 0)) > len(entries):
            out.append(Disagreement(run_id, f"step {step}", f"{int(sealed['count']) - len(entries)} journal entries "
                                    "are missing (the run sealed more than the store holds)"))
    return out


def _run_disagreements(record: RunRecord, journals: Mapping[int, Sequence[JournalEntry]], trail: RunTrail,
                       approvals: Sequence[PendingApproval], seal: StoreSeal) -> list[Disagreement]:
    run_id = record.run_id
    out = _seal_disagreements(record, journals, seal)
    out.extend(behind_trail(record, journals, trail, approvals))
    # Calls journaled as done must have ended in the log with the same status, unless the log has no outcome of
    # theirs but its reopening's `unknown`: the journal's done is written first, and its writer stopped then.
    entries = {e.call_id: e for step in journals.values() for e in step}
    for entry in entries.values():
        seen = trail.outcomes.get(entry.call_id, [])
        if entry.state == "done" and entry.status not in seen and not _cut_short(trail, entry.call_id, seen):
            out.append(Disagreement(run_id, _where(entry.step, entry.seq, entry.tool), (
                f"journaled as done ({entry.status}), but the audit trail has no outcome {entry.status} for call "
                f"{entry.call_id}")))
    finished = trail.finished.get("status") if trail.finished is not None else None
    if record.status in FINAL:  # a finished run: every call the log saw end is journaled as it ended
        for call_id, statuses in trail.outcomes.items():
            place = journal_place(run_id, call_id)
            kept = entries.get(call_id)
            if place is None or (kept is not None and kept.state == "done" and kept.status == statuses[-1]):
                continue
            if kept is not None and kept.state == "done" and _cut_short(trail, call_id, statuses):
                continue  # journaled done, then the writer stopped before the log's outcome (closed on reopening)
            if kept is not None and kept.state == "suspended" and statuses[-1] == "denied":
                continue  # the suspension's own outcome, in a run that ended without coming back to the call
            if kept is None and call_id in trail.unjournaled:
                continue  # refused because the store could not record it: the trail says so, and it never ran
            late = _ended_after_takeover(trail, call_id, kept.status) if kept is not None and kept.state == "done" \
                else None
            if late is not None and kept is not None:
                step, seq = place
                out.append(Disagreement(run_id, _where(step, seq, kept.tool), (
                    f"call {call_id} ended {late.get('status')} (seq {late.get('seq')}) in the process that had the "
                    "run before another resumed it, after that resume: the tool ran to its end there; the journal "
                    f"keeps {kept.status}, as the process that took the run over recorded it (its outcome was not "
                    "known then)"), takeover=True))
                continue
            step, seq = place
            now = f"journaled as {kept.state} ({kept.status})" if kept is not None else "not journaled"
            out.append(Disagreement(run_id, _where(step, seq, kept.tool if kept else "?"), (
                f"the audit trail records call {call_id} as ended {statuses[-1]}, but it is {now}")))
        if finished is None and record.status != "cancelled":  # a cancel from the store is not the run's
            out.append(Disagreement(run_id, "run record", (
                f"the store has the run {record.status}, but the audit trail never recorded it finishing "
                "(no run_finished)")))
    if finished in FINAL and record.status in FINAL and finished != record.status:
        out.append(Disagreement(run_id, "run record", (
            f"the store has the run {record.status}, but the audit trail's run_finished says {finished}")))
    for ended in trail.unshown_takeovers:  # the store's word alone: a run's owner is written by the store's writers
        out.append(Disagreement(run_id, "run record", (
            f"a process stopped working on the run (run_finished interrupted, seq {ended.get('seq')}) because the "
            "store named another process as its owner, but no process resumed the run after this one opened it "
            f"(seq {ended.get('opened_seq')}): the log holds no run_resumed since; the run's owner was changed in "
            "the store")))
    for ended in trail.taken_over:  # seen as what it is: another process's resume took the run from this one
        out.append(Disagreement(run_id, "run record", (
            f"a process stopped working on the run (run_finished interrupted, seq {ended.get('seq')}) because "
            "another had taken it over after its lease ran out; its later calls were refused, and the run's own "
            "ending is the other process's"), takeover=True))
    out.extend(_answer_disagreements(record, journals, trail, approvals))
    for a in approvals:  # (a gate refuses an answer given to such an approval: `InboxApprover`)
        asked = trail.asked.get((a.call_id, a.binding))
        # (compared as the log holds values: floats tagged, `proctor.canonical.jsonable`)
        if asked is not None and (a.tool != asked.get("tool") or jsonable(a.args) != jsonable(asked.get("args"))):
            out.append(Disagreement(run_id, f"approval {a.id} ({a.tool})", (
                "shows its answerers other arguments than the audit trail recorded when the call was asked about "
                f"(seq {asked.get('seq')}): changed in the store")))
    return out


def _ended_after_takeover(trail: RunTrail, call_id: str, journaled: str | None) -> Mapping[str, Any] | None:
    """The outcome of call `call_id` that the process which lost the run wrote after another took it over, when the
    journal's status `journaled` is the one that other process recorded (else None).

    That is: the call started (its live intent) before a `run_resumed` of the run; after that resume, the process
    that resumed it recorded the outcome the journal holds, on stable storage first (``journaled: true``); every
    other outcome of the call after the resume was written without the journal (the process that lost the run
    writes nothing more to the store). Every record named is the log's own (hash-chained; the store's writers
    cannot write it), so none of this can be made from the store: an earlier journal entry put back is not a
    `done` that the taker journaled."""
    intent = trail.started.get(call_id)
    at = intent.get("seq") if intent is not None else None
    if not isinstance(at, int):
        return None
    resume = next((s for s in trail.resumed if s > at), None)
    if resume is None:
        return None
    after = [r for r in trail.outcome_records.get(call_id, []) if isinstance(r.get("seq"), int) and r["seq"] > resume]
    taker = [r for r in after if r.get("journaled") is True]
    late = [r for r in after if r.get("journaled") is not True]
    if not taker or not late or taker[-1].get("status") != journaled:
        return None
    return late[-1]


def _cut_short(trail: RunTrail, call_id: str, seen: Sequence[str]) -> bool:
    """Whether the log has no outcome of the call but the `unknown` its reopening closed the intent with."""
    return all(s == "unknown" for s in seen) and (not seen or call_id in trail.recovered)


def _grant_of(value: Any) -> tuple[str, str] | None:
    if not isinstance(value, Mapping):
        return None
    from proctor.canonical import canonical_bytes

    return str(value.get("tool")), canonical_bytes(dict(value.get("args") or {})).decode()


def _answer_disagreements(record: RunRecord, journals: Mapping[int, Sequence[JournalEntry]], trail: RunTrail,
                          approvals: Sequence[PendingApproval]) -> list[Disagreement]:
    """Grants and answers the store holds that no `approval_resolved` of the log gave."""
    run_id, out = record.run_id, []
    given = {g for rec in trail.resolved if (g := _grant_of(rec.get("grant"))) is not None}
    for grant in record.grants:
        if _grant_of(grant) not in given:
            out.append(Disagreement(run_id, "run record", (
                f"holds a grant for {grant.get('tool')} that no approval_resolved of the audit trail gave")))
    for step in journals.values():
        for entry in step:
            if entry.grant is not None and _grant_of(entry.grant) not in given:
                out.append(Disagreement(run_id, _where(entry.step, entry.seq, entry.tool), (
                    f"carries a grant for {entry.grant.get('tool')} that no approval_resolved of the audit trail "
                    "gave")))
    answered = {(rec.get("call_id"), rec.get("verdict"), rec.get("approver")) for rec in trail.resolved}
    waiting = set(record.pending)  # (kept until the run ends: a resume that died before reading one keeps it)
    for a in approvals:
        if a.status != "answered" or a.answer is None or a.id in waiting:
            continue  # (an answer its suspended run has not read yet is in the log once a resume reads it)
        if (a.call_id, a.answer.verdict, a.answer.approver) not in answered:
            out.append(Disagreement(run_id, f"approval {a.id} ({a.tool})", (
                f"answered {a.answer.verdict} by {a.answer.approver} in the store, but no approval_resolved of the "
                "audit trail records that answer")))
    return out
