"""A finished run rebuilt from the audit log alone, for `proctor audit show --run RUN_ID`.

The log holds, for each step, a ``step`` record (the model's thought and the program,
both scrubbed of redacted values, the ids of the step's calls, its error and usage) and,
for each call, its ``call_intent`` (tool, redacted arguments, decision, rules, approval)
and ``call_outcome`` (status, error). From those alone `run_from_records` rebuilds a
`RunResult` that `proctor.agent.render.print_run` shows exactly as `agent.replay()`
shows a run from memory, with notes where the run was suspended, resumed, interrupted
or left without an end. What the log never holds is not shown: tool results, the
program's printed output and the final answer's value.

Everything here comes from a file: it is data. The renderer escapes it for the terminal.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from proctor.agent.models import Usage
from proctor.agent.result import RUN_STATUSES, RunResult, StepRecord
from proctor.calls import CallRecord, Decision
from proctor.errors import AuditError

__all__ = ["ReplayedRun", "run_from_log", "run_from_records"]

_STATUSES = ("ok", "denied", "failed", "timeout", "unknown", "cancelled")
_SIDE_EFFECTS = ("none", "read", "write", "external", "destructive")
_OUTCOMES = ("allow", "deny", "require_approval")


@dataclass
class ReplayedRun:
    """A run as the audit log tells it: the result to print, and notes to print before step *i*.

    `ended` is ``finished`` (a ``run_finished`` record), ``suspended`` (the last record of
    the run is ``run_suspended``) or ``unfinished`` (neither: the process died, or the run
    is still going). `notes[i]` go before `result.steps[i]`; `notes[len(steps)]` after the last.
    """

    result: RunResult
    ended: str
    notes: dict[int, list[str]] = field(default_factory=dict)
    skipped: int = 0
    #: Records of the run that do not hold in the log's hash chain (edited, inserted or appended by hand).
    broken: list[str] = field(default_factory=list)

    def note(self, before: int, text: str) -> None:
        self.notes.setdefault(before, []).append(text)


def run_from_log(path: str | os.PathLike[str], run_id: str) -> ReplayedRun:
    """The run `run_id` of the log file at `path`; `AuditError` when the log has none of its records."""
    from proctor.audit.lines import read_records

    # A record names its run as "run_id":"<id>" in canonical JSON; the id is JSON-escaped there.
    needle = json.dumps(run_id, ensure_ascii=False)[1:-1].encode("utf-8")
    broken: list[str] = []
    records, bad = read_records(path, containing=needle, broken=broken)
    replayed = run_from_records(records, run_id, audit_path=os.fspath(path))
    replayed.skipped, replayed.broken = bad, broken
    return replayed


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _decision(intent: Mapping[str, Any]) -> Decision | None:
    raw = intent.get("decision")
    rules: Any = intent.get("rules")
    reason: Any = intent.get("reason")
    if isinstance(raw, Mapping):  # an older or hand-written record: {"outcome", "rules", "reason"}
        rules, reason, raw = raw.get("rules", rules), raw.get("reason", reason), raw.get("outcome")
    if raw not in _OUTCOMES:
        return None
    rule_names = tuple(str(r) for r in rules) if isinstance(rules, list) else ()
    return Decision(cast(Any, raw), rule_names, str(reason or ""), str(intent.get("policy_sha256") or ""))


def _approval(intent: Mapping[str, Any], resolved: Mapping[str, Any] | None) -> str | None:
    source = intent.get("approval")
    if not isinstance(source, Mapping) or not source.get("verdict"):
        source = resolved
    if not isinstance(source, Mapping) or not source.get("verdict"):
        return None
    who, where = source.get("approver"), source.get("address")
    if who and where:  # the answer's address is its own field; say it where the name is read
        who = f"{who} from {where}"
    return f"{source['verdict']} by {who}" if who else str(source["verdict"])


def _error_type(status: str, error: str | None, decision: Decision | None, approval: str | None,
                budget: str | None) -> str | None:
    """What kind of error ended the call, as far as the log tells (the renderer words outcomes by it)."""
    if status == "ok":
        return None
    if budget is not None:
        return "BudgetExceeded"
    if status in ("failed", "timeout", "unknown"):
        return "ToolFailed"
    if status == "cancelled":
        return "CallRefused"
    if approval is not None and approval.startswith(("denied", "timeout")):
        return "ApprovalTimeout" if "timeout" in approval or (error and "timed out" in error) else "ApprovalDenied"
    if approval is not None and approval.startswith("suspended"):
        return "RunSuspended"
    if decision is not None and decision.outcome == "deny":
        return "ToolDenied"
    return "CallRefused" if error else None


class _Calls:
    """The run's calls by id, built from their intent, outcome, approval and budget records."""

    def __init__(self) -> None:
        self.intents: dict[str, dict[str, Any]] = {}
        self.outcomes: dict[str, dict[str, Any]] = {}
        self.resolved: dict[str, dict[str, Any]] = {}
        self.budgets: dict[str, str] = {}
        self.order: list[str] = []

    def feed(self, rec: dict[str, Any]) -> None:
        call_id = rec.get("call_id")
        if not isinstance(call_id, str):
            return
        kind = rec.get("kind")
        if kind == "call_intent":
            if call_id not in self.intents:
                self.order.append(call_id)
            self.intents[call_id] = rec  # a refused call's intent comes once; the last one wins
        elif kind == "call_outcome":
            self.outcomes[call_id] = rec
        elif kind == "approval_resolved":
            self.resolved[call_id] = rec
        elif kind == "budget_exhausted":
            self.budgets[call_id] = str(rec.get("budget") or "")

    def record(self, call_id: str) -> CallRecord | None:
        intent = self.intents.get(call_id)
        if intent is None:
            return None
        outcome = self.outcomes.get(call_id)
        status = str(outcome.get("status")) if outcome is not None else "unknown"
        if status not in _STATUSES:
            status = "unknown"
        decision = _decision(intent)
        approval = _approval(intent, self.resolved.get(call_id))
        error = _text((outcome or {}).get("error")) or _text(intent.get("error"))
        if outcome is None:
            error = "no outcome in the audit log: the process ended while the call was under way"
        budget = self.budgets.get(call_id)
        side_effect = intent.get("side_effect")
        args = intent.get("args")
        return CallRecord(call_id, str(intent.get("tool") or "?"), dict(args) if isinstance(args, Mapping) else {},
                          cast(Any, side_effect if side_effect in _SIDE_EFFECTS else "destructive"), decision,
                          cast(Any, status), _int((outcome or {}).get("duration_ns")), error,
                          _error_type(status, error, decision, approval, budget), approval, budget or None)


def _number(value: Any) -> float | None:
    """A number from a record (canonical JSON keeps a float as ``{"$float": "0.25"}``)."""
    if isinstance(value, Mapping) and set(value) == {"$float"}:  # how canonical JSON keeps a float
        value = value["$float"]
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _step(rec: Mapping[str, Any], calls: list[CallRecord]) -> StepRecord:
    usage = rec.get("usage") if isinstance(rec.get("usage"), Mapping) else {}
    assert isinstance(usage, Mapping)
    kind = "planning" if rec.get("step_kind") == "planning" else "action"
    cost = rec.get("cost_usd")
    return StepRecord(_int(rec.get("step")), cast(Any, kind), model_output=str(rec.get("thought") or ""),
                      code=_text(rec.get("code")), tool_calls=calls,
                      usage=Usage(_int(usage.get("input_tokens")), _int(usage.get("output_tokens"))),
                      cost_usd=_number(cost),
                      error=_text(rec.get("error")), duration_ns=_int(rec.get("duration_ns")),
                      final_answer=rec.get("final_answer") is True,
                      images=[dict(i) for i in rec.get("images") or () if isinstance(i, Mapping)])


def _of_run(records: Iterable[Mapping[str, Any]], run_id: str) -> Iterator[dict[str, Any]]:
    for rec in records:
        if isinstance(rec, dict) and rec.get("run_id") == run_id:
            yield rec


def run_from_records(records: Iterable[Mapping[str, Any]], run_id: str, *,
                     audit_path: str | None = None) -> ReplayedRun:
    """Rebuild run `run_id` from audit records (in log order); `AuditError` when none belongs to it."""
    mine = list(_of_run(records, run_id))
    if not mine:
        raise AuditError(f"run {run_id!r} has no record in the log; `proctor audit show LOG` lists the runs in it")
    calls = _Calls()
    steps: list[StepRecord] = []
    replayed = ReplayedRun(RunResult(None, "done", steps, Usage(), None, run_id=run_id, audit_path=audit_path),
                           ended="unfinished")
    claimed: set[str] = set()
    end: Mapping[str, Any] | None = None
    last: Mapping[str, Any] | None = None
    resumed = False
    for rec in mine:
        calls.feed(rec)  # a step's calls as they stood when its record was written
        kind = rec.get("kind")
        if kind == "step" and rec.get("parent_call_id") is not None:
            # A managed agent's step (same run): told as a note before the parent's step that called it.
            ids = [str(c) for c in rec.get("call_ids") or () if isinstance(c, str)]
            claimed.update(ids)
            done = [f"{c.tool} {c.status}" for c in (calls.record(i) for i in ids) if c is not None]
            replayed.note(len(steps), f"managed agent {rec.get('agent')!r}, its step {_int(rec.get('step'))}: "
                                      + (", ".join(done) or "no calls")
                                      + (f"; error: {rec.get('error')}" if rec.get("error") else ""))
        elif kind == "step":
            ids = [str(c) for c in rec.get("call_ids") or () if isinstance(c, str)]
            found = [c for c in (calls.record(i) for i in ids) if c is not None]
            claimed.update(ids)
            step = _step(rec, found)
            if resumed and steps and (steps[-1].number, steps[-1].kind) == (step.number, step.kind):
                # The step that was paused, run again on resume: its record now holds all its calls.
                _drop_last(replayed)
            resumed = False
            steps.append(step)
        elif kind == "run_suspended":
            pending = ", ".join(str(p) for p in rec.get("pending") or ())
            replayed.note(len(steps), f"run suspended at step {_int(rec.get('step'))}: waiting for approval "
                                      f"{pending or '(none named)'}")
        elif kind == "run_resumed":
            resumed = True
            replayed.note(len(steps), f"run resumed at step {_int(rec.get('step'))}: calls the step made before "
                                      "the pause are answered from the run's journal, not run again")
        elif kind == "call_replayed":
            n = len(rec.get("calls") or ())
            replayed.note(len(steps), f"{n} call(s) of step {_int(rec.get('step'))} answered from the journal")
        elif kind == "replay_diverged":
            replayed.note(len(steps), f"the resumed program diverged from its journal at step "
                                      f"{_int(rec.get('step'))}: {rec.get('error') or ''}")
        elif kind == "run_finished":
            end = rec
        if kind in ("run_finished", "run_suspended", "run_resumed", "run_started"):
            last = rec
    _orphans(replayed, calls, claimed)
    _ending(replayed, mine, end, last)
    return replayed


def _drop_last(replayed: ReplayedRun) -> None:
    """Forget the last step (superseded), keeping the notes that followed it before the step that replaces it."""
    steps = replayed.result.steps
    steps.pop()
    after = replayed.notes.pop(len(steps) + 1, [])
    if after:
        replayed.notes.setdefault(len(steps), []).extend(after)


def _orphans(replayed: ReplayedRun, calls: _Calls, claimed: set[str]) -> None:
    """Calls no step record lists (the step never ended): a step of their own, saying so."""
    loose: dict[int, list[CallRecord]] = {}
    for call_id in calls.order:
        if call_id in claimed:
            continue
        record = calls.record(call_id)
        if record is not None:
            loose.setdefault(_int(calls.intents[call_id].get("step")), []).append(record)
    for number, found in sorted(loose.items()):
        replayed.result.steps.append(StepRecord(number, tool_calls=found, error=(
            "this step has no step record in the audit log: it did not end (the process was killed, or the run "
            "is still going); its calls are shown as far as they were recorded")))


def _ending(replayed: ReplayedRun, mine: list[dict[str, Any]], end: Mapping[str, Any] | None,
            last: Mapping[str, Any] | None) -> None:
    result = replayed.result
    result.usage = sum((s.usage for s in result.steps), Usage())
    times = [r["ts_ns"] for r in mine if isinstance(r.get("ts_ns"), int)]
    result.duration_ns = max(times) - min(times) if times else 0
    result.trace_id = next((str(r["trace_id"]) for r in mine if r.get("trace_id")), None)
    if last is not None and last.get("kind") == "run_suspended":
        replayed.ended, result.status = "suspended", "suspended"
        result.error = "waiting for approval " + ", ".join(str(p) for p in last.get("pending") or ())
        replayed.note(len(result.steps), "the run is suspended: `proctor runs resume RUN_ID` goes on with it "
                                         "once the approvals are answered")
        return
    if end is None or last is not end:
        replayed.ended = "unfinished"
        result.status = cast(Any, "unfinished")
        result.error = ("the audit log has no end for this run: its process was killed, or the run is still going")
        return
    replayed.ended = "finished"
    status = str(end.get("status") or "error")
    if status not in RUN_STATUSES:  # the log is data: only a status proctor writes is shown as one
        result.error = f"unknown status {status!r} in the log" + (f": {end.get('error')}" if end.get("error") else "")
        result.status = cast(Any, "unknown")
        return
    result.status = cast(Any, status)
    result.error = _text(end.get("error"))
    usage = end.get("usage")
    if isinstance(usage, Mapping):
        result.cost_usd = _number(usage.get("cost_usd"))
    if status == "interrupted":
        replayed.note(len(result.steps), f"the run was interrupted: {result.error or 'Ctrl-C or a signal'}")


def run_from_store(record: Any, journal: Iterable[Any] = (), waiting: Iterable[Any] = ()) -> ReplayedRun:
    """A durable run as the run store keeps it (`RunRecord`), for `proctor runs show RUN_ID`.

    Finished steps come from `record.steps`; the step in progress of a suspended (or running,
    or crashed) run from its saved model answer and its `journal` entries; `waiting` are the
    approvals it waits for (`PendingApproval`s).
    """
    from proctor.agent.durable import step_from_dict
    from proctor.agent.parsing import CodeParseError, extract_code
    from proctor.gate.journal import record_from_dict

    steps = [step_from_dict(s) for s in record.steps]
    result = RunResult(record.answer, cast(Any, record.status), steps, sum((s.usage for s in steps), Usage()), None,
                       run_id=record.run_id, trace_id=record.trace_id, error=record.error,
                       audit_path="not named in the run store (`proctor audit show LOG --run RUN_ID` reads one)",
                       duration_ns=max(0, (record.updated_at_ns or 0) - (record.created_at_ns or 0)))
    costs = [s.cost_usd for s in steps if s.cost_usd is not None]
    result.cost_usd = sum(costs) if costs else None
    replayed = ReplayedRun(result, ended="finished" if record.status not in ("running", "suspended")
                           else str(record.status))
    done_numbers = {s.number for s in steps if s.kind == "action"}
    if record.status in ("running", "suspended") and record.step and record.step not in done_numbers:
        response = (record.step_state or {}).get("response")
        content = str(response.get("content") or "") if isinstance(response, Mapping) else ""
        try:
            code: str | None = extract_code(content) if content else None
        except CodeParseError:
            code = None
        calls: list[CallRecord] = []
        unsettled: list[str] = []
        for entry in journal:
            if entry.state == "done" and isinstance(entry.record, Mapping):
                calls.append(record_from_dict(entry.record))
            else:
                unsettled.append(f"{entry.tool} ({entry.call_id})")
        current = StepRecord(int(record.step), model_output=content, code=code, tool_calls=calls)
        if unsettled:
            current.error = ("calls that were about to run when the process stopped (they may have run): "
                             + ", ".join(unsettled))
        replayed.note(len(steps), f"step {record.step} is in progress"
                      + ("" if content else " (the model had not answered yet)"))
        steps.append(current)
    for approval in waiting:
        replayed.note(len(steps), f"waiting for approval {approval.id} of {approval.tool} ({approval.status}): "
                                  f"`proctor approvals show {approval.id}`")
    return replayed
