"""What the inbox shows: approvals, runs and a run's timeline as plain data for the templates and the API."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from proctor.calls import source_lines
from proctor.errors import StoreError
from proctor.store.base import PendingApproval, RunRecord, RunStore

__all__ = ["PREVIEW_CHARS", "approval_view", "budget_rows", "display_fields", "filter_approvals", "hidden_fields",
           "next_steps", "preview", "program_lines", "run_calls", "run_view"]

#: How much of an earlier call's result the approval page shows.
PREVIEW_CHARS = 300


def filter_approvals(items: Sequence[PendingApproval], *, tool: str = "", principal: str = "",
                     label: str = "") -> list[PendingApproval]:
    """Approvals matching every filter given: a tool name, a principal, a run label ``KEY=VALUE`` (or ``KEY``)."""
    key, _, value = label.partition("=")
    out = []
    for a in items:
        if tool and a.tool != tool:
            continue
        if principal and (a.principal or "") != principal:
            continue
        if key and (key not in a.labels or (value and a.labels.get(key) != value)):
            continue
        out.append(a)
    return out


def program_lines(code: str, line: int | None = None, col: int | None = None, end_line: int | None = None,
                  end_col: int | None = None) -> list[dict[str, Any]]:
    """The program's lines (numbered as Python numbers them); the lines of the pending call (from its
    reported `line` to `end_line`) are marked, and the call expression itself, from `col` to `end_col`,
    is cut out as `at` (with `before` and `after` it). Never found by the tool's name: a tool called on
    two lines is pending at one of them only. Without a reported position nothing is marked."""
    last = end_line if end_line is not None and line is not None and end_line >= line else line
    lines = source_lines(code)
    if lines and lines[-1] == "":
        lines.pop()  # the newline ending the program
    out: list[dict[str, Any]] = []
    for n, text in enumerate(lines, 1):
        marked = line is not None and last is not None and line <= n <= last
        entry: dict[str, Any] = {"number": n, "text": text, "marked": marked, "first": n == line}
        raw = text.encode()
        if marked and col is not None:
            # Columns count UTF-8 bytes, as `ast` does; the call may go on over the next lines.
            start = col if n == line else len(raw) - len(raw.lstrip())
            stop = end_col if n == last and end_col is not None else len(raw)
            if 0 <= start <= stop <= len(raw):
                entry.update(before=raw[:start].decode(errors="replace"), at=raw[start:stop].decode(errors="replace"),
                             after=raw[stop:].decode(errors="replace"), col=col if n == line else None)
        out.append(entry)
    return out


def budget_rows(left: Mapping[str, Any], spend: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each budget with what the pending call takes from it and what it has left before and after
    (`left` is held after: the call's reservation is counted while it waits). A budget the call does
    not count against shows what it has left and takes nothing."""
    rows: list[dict[str, Any]] = []
    for name, after in left.items():
        takes = spend.get(name) if isinstance(spend.get(name), Mapping) else None
        kinds = []
        for kind, value in (after.items() if isinstance(after, Mapping) else ()):
            taken = takes.get(kind) if takes is not None else None
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            before = value + taken if number and isinstance(taken, (int, float)) else value
            kinds.append({"kind": kind, "takes": taken, "before": before, "after": value})
        rows.append({"budget": name, "counts": takes is not None, "kinds": kinds,
                     "text": _budget_text(kinds, counts=takes is not None)})
    return rows


def _budget_text(kinds: Sequence[Mapping[str, Any]], *, counts: bool) -> str:
    """``calls: takes 1 of 2 left → 1; cost: takes 10 of 20 left → 10`` (or what is left, when it takes nothing)."""
    parts = []
    for k in kinds:
        label = k["kind"].replace("_", " ")
        if k["takes"] is not None:
            parts.append(f"{label}: takes {_n(k['takes'])} of {_n(k['before'])} left → {_n(k['after'])}")
        elif counts and k["kind"] == "wall_time_ms":
            parts.append(f"{label}: {_n(k['after'])} left, counted while it runs")
        else:
            parts.append(f"{label}: {_n(k['after'])} left")
    if not parts:
        return "counts this call" if counts else "no limit set"
    return "; ".join(parts) + ("" if counts else " (this call does not count against it)")


def _n(value: Any) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _program(record: RunRecord | None) -> str:
    content = _content(record)
    if not content:
        return ""
    from proctor.agent.parsing import CodeParseError, extract_code

    try:
        return extract_code(content)
    except CodeParseError:
        return ""


def _content(record: RunRecord | None) -> str:
    if record is None or not record.step_state:
        return ""
    response = record.step_state.get("response") or {}
    content = response.get("content") if isinstance(response, Mapping) else None
    return content if isinstance(content, str) else ""


def _thought(record: RunRecord | None) -> str:
    """What the model wrote before the step's program (its "Thought:")."""
    content = _content(record)
    for marker in ("```", "<code>"):
        content = content.split(marker, 1)[0]
    return content.strip()


def preview(value: Any, limit: int = PREVIEW_CHARS) -> str:
    """A bounded text of a call's result: at most `limit` characters, saying how much was left out."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)
    if len(text) <= limit:
        return text
    # (three dots, not U+2026: the page marks characters outside ASCII punctuation as look-alikes)
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def run_calls(store: RunStore, record: RunRecord) -> list[dict[str, Any]]:
    """The run's calls so far, oldest first: finished steps', then the journal of the step in progress
    (with a bounded preview of each result)."""
    calls: list[dict[str, Any]] = []
    for step in record.steps:
        for c in step.get("tool_calls") or ():
            decision = c.get("decision") or {}
            calls.append({"step": step.get("number"), "call_id": c.get("call_id"), "tool": c.get("tool"),
                          "args": c.get("args"), "status": c.get("status"), "decision": decision.get("outcome"),
                          "approval": c.get("approval"), "error": c.get("error"), "result": None})
    if record.step and record.status in ("running", "suspended"):
        for e in store.journal(record.run_id, record.step):
            r = e.record or {}
            calls.append({"step": record.step, "call_id": e.call_id, "tool": e.tool, "args": r.get("args", {}),
                          "status": e.status or "in progress", "decision": (r.get("decision") or {}).get("outcome"),
                          "approval": r.get("approval"),
                          "error": (e.error or {}).get("message") if e.error else None,
                          "result": preview(e.value) if e.state == "done" and e.status == "ok" else None})
    return calls


def hidden_fields(args: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The (dotted) fields of `args` an approver is shown only as a redaction marker."""
    out: list[str] = []
    for name, value in args.items():
        if isinstance(value, Mapping):
            if set(value) == {"$redacted"}:
                out.append(prefix + name)
            else:
                out.extend(hidden_fields(value, f"{prefix}{name}."))
    return out


def next_steps(store: RunStore, approval: PendingApproval, record: RunRecord | None, *, resumes: bool) -> str:
    """After an answer, what happens to the run, in words: who resumes it, or what it still waits for."""
    if approval.status == "void":
        return "This approval was voided: the run was cancelled or asked again under a changed policy."
    if approval.status == "expired":
        return ("Nobody answered before the deadline: the call ends as the policy's approval.on_timeout says "
                "when the run is resumed.")
    if approval.status != "answered" or record is None:
        return ""
    rid = record.run_id
    if record.status == "suspended":
        others = [a.id for a in store.list_approvals(status="pending", run_id=rid)]
        if others:
            return (f"Run {rid} stays suspended: it still waits for {len(others)} other approval(s) "
                    f"({', '.join(others)}).")
        if resumes:
            return f"Run {rid} is resumed by this inbox (it runs with --resume) within a few seconds."
        return (f"Run {rid} stays suspended until someone resumes it: `proctor runs resume {rid} --tools MOD:ATTR "
                "--policy P --model ID`, "
                "`agent.resume(run_id)`, or an inbox started with `proctor serve --resume`.")
    if record.status == "running":
        return f"Run {rid} is running again (resumed by {record.owner or 'a process'})."
    return f"Run {rid} has ended: {record.status}."


def approval_view(store: RunStore, approval: PendingApproval, *, resumes: bool = False) -> dict[str, Any]:
    """Everything an approver needs to decide one call: the call (in clear, but for fields hidden from
    approvers), where the program makes it, the step's thought and earlier calls, the run, the deadline,
    the budgets; and once answered, what happens next. `display` holds the untrusted texts with
    look-alike and invisible characters marked (`proctor.termsafe.marked_plain`)."""
    try:
        record: RunRecord | None = store.get_run(approval.run_id)
    except StoreError:
        record = None
    code = _program(record)
    shown = dict(approval.shown_args) if approval.shown_args is not None else dict(approval.args)
    calls = run_calls(store, record) if record is not None else []
    return {
        "approval": approval.as_dict(),
        "shown_args": shown,
        "hidden": hidden_fields(shown),
        "position": {"line": approval.line, "col": approval.col, "end_line": approval.end_line,
                     "end_col": approval.end_col} if approval.line is not None else None,
        "budgets": budget_rows(approval.budget, approval.spend),
        "run": _run_summary(record) if record is not None else None,
        "thought": _thought(record),
        "program": program_lines(code, approval.line, approval.col, approval.end_line, approval.end_col)
        if code else [],
        "calls": [c for c in calls if c.get("call_id") != approval.call_id],
        "next": next_steps(store, approval, record, resumes=resumes),
        "display": display_fields(approval, shown, record),
    }


def display_fields(approval: PendingApproval, shown: Mapping[str, Any], record: RunRecord | None) -> dict[str, Any]:
    """The texts an approver reads, marked as the console marks them (look-alikes named, invisibles escaped)."""
    from proctor.termsafe import marked_plain

    return {
        "tool": marked_plain(approval.tool),
        "args": {marked_plain(k): marked_plain(json.dumps(v, ensure_ascii=False, default=str))
                 for k, v in shown.items()},
        "principal": marked_plain(approval.principal or ""),
        "reason": marked_plain(approval.reason),
        "task": marked_plain(record.task, keep_newlines=True) if record is not None else "",
        "labels": {marked_plain(k): marked_plain(v) for k, v in approval.labels.items()},
    }


def _run_summary(record: RunRecord) -> dict[str, Any]:
    return {"run_id": record.run_id, "status": record.status, "task": record.task, "principal": record.principal,
            "labels": dict(record.labels), "agent": record.agent, "step": record.step,
            "created_at_ns": record.created_at_ns, "updated_at_ns": record.updated_at_ns, "error": record.error,
            "answer": record.answer if record.status == "done" else None}


def run_view(store: RunStore, record: RunRecord) -> dict[str, Any]:
    """A run's timeline: its steps with their programs and calls, what it waits for, and every approval it
    asked for, oldest first, with who answered, when, why, and original and edited arguments."""
    waiting = [a.as_dict() for a in store.list_approvals(status=None, run_id=record.run_id)
               if a.id in set(record.pending) or a.status == "pending"]
    steps = [{"number": s.get("number"), "kind": s.get("kind"), "code": s.get("code"),
              "observation": s.get("observation"), "error": s.get("error"),
              "calls": [{"tool": c.get("tool"), "args": c.get("args"), "status": c.get("status"),
                         "decision": (c.get("decision") or {}).get("outcome"),
                         "approval": c.get("approval")} for c in s.get("tool_calls") or ()]}
             for s in record.steps]
    approvals = [a.as_dict() for a in reversed(store.list_approvals(status=None, run_id=record.run_id))]
    return {"run": _run_summary(record), "steps": steps, "waiting": waiting,
            "calls": run_calls(store, record), "approvals": approvals}
