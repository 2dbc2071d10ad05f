"""What the inbox shows: approvals, runs and a run's timeline as plain data for the templates and the API."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from proctor.errors import StoreError
from proctor.store.base import PendingApproval, RunRecord, RunStore

__all__ = ["PREVIEW_CHARS", "approval_view", "display_fields", "filter_approvals", "hidden_fields", "next_steps",
           "preview", "program_lines", "run_calls", "run_view"]

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


def program_lines(code: str, line: int | None = None, col: int | None = None) -> list[dict[str, Any]]:
    """The program's lines; the one where the pending call was made (its reported `line`) is marked,
    with the column it starts at. Never found by the tool's name: a tool called on two lines is
    pending at one of them only. Without a reported position nothing is marked."""
    out: list[dict[str, Any]] = []
    for n, text in enumerate(code.splitlines(), 1):
        entry: dict[str, Any] = {"number": n, "text": text, "marked": n == line}
        raw = text.encode()
        if n == line and col is not None and 0 <= col <= len(raw):
            head = raw[:col].decode(errors="replace")  # a column counts UTF-8 bytes, as `ast` does
            entry.update(before=head, at=text[len(head):], col=col)
        out.append(entry)
    return out


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
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


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
        return (f"Run {rid} stays suspended until someone resumes it: `proctor runs resume {rid} …`, "
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
        "position": {"line": approval.line, "col": approval.col} if approval.line is not None else None,
        "run": _run_summary(record) if record is not None else None,
        "thought": _thought(record),
        "program": program_lines(code, approval.line, approval.col) if code else [],
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
