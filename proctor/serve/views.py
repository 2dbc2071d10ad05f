"""What the inbox shows: approvals, runs and a run's timeline as plain data for the templates and the API."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from proctor.errors import StoreError
from proctor.store.base import PendingApproval, RunRecord, RunStore

__all__ = ["approval_view", "filter_approvals", "program_lines", "run_calls", "run_view"]


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


def program_lines(code: str, tool: str) -> list[dict[str, Any]]:
    """The program's lines, each marked when it calls `tool` (where the pending call can come from)."""
    call = re.compile(rf"(?<![\w.]){re.escape(tool)}\s*\(")
    return [{"number": n, "text": text, "marked": bool(call.search(text))}
            for n, text in enumerate(code.splitlines(), 1)]


def _program(record: RunRecord | None) -> str:
    if record is None or not record.step_state:
        return ""
    response = record.step_state.get("response") or {}
    content = response.get("content") if isinstance(response, Mapping) else None
    if not isinstance(content, str):
        return ""
    from proctor.agent.parsing import CodeParseError, extract_code

    try:
        return extract_code(content)
    except CodeParseError:
        return ""


def run_calls(store: RunStore, record: RunRecord) -> list[dict[str, Any]]:
    """The run's calls so far, oldest first: finished steps', then the journal of the step in progress."""
    calls: list[dict[str, Any]] = []
    for step in record.steps:
        for c in step.get("tool_calls") or ():
            decision = c.get("decision") or {}
            calls.append({"step": step.get("number"), "tool": c.get("tool"), "args": c.get("args"),
                          "status": c.get("status"), "decision": decision.get("outcome"), "error": c.get("error")})
    if record.step and record.status in ("running", "suspended"):
        for e in store.journal(record.run_id, record.step):
            r = e.record or {}
            calls.append({"step": record.step, "tool": e.tool, "args": r.get("args", {}),
                          "status": e.status or "in progress", "decision": (r.get("decision") or {}).get("outcome"),
                          "error": (e.error or {}).get("message") if e.error else None})
    return calls


def approval_view(store: RunStore, approval: PendingApproval) -> dict[str, Any]:
    """Everything an approver needs to decide one call: the call, the rule, the run, its program and history."""
    try:
        record: RunRecord | None = store.get_run(approval.run_id)
    except StoreError:
        record = None
    code = _program(record)
    return {
        "approval": approval.as_dict(),
        "run": _run_summary(record) if record is not None else None,
        "program": program_lines(code, approval.tool) if code else [],
        "calls": run_calls(store, record) if record is not None else [],
    }


def _run_summary(record: RunRecord) -> dict[str, Any]:
    return {"run_id": record.run_id, "status": record.status, "task": record.task, "principal": record.principal,
            "labels": dict(record.labels), "agent": record.agent, "step": record.step,
            "created_at_ns": record.created_at_ns, "updated_at_ns": record.updated_at_ns, "error": record.error,
            "answer": record.answer if record.status == "done" else None}


def run_view(store: RunStore, record: RunRecord) -> dict[str, Any]:
    """A run's timeline: its steps with their programs and calls, and what it waits for."""
    waiting = [a.as_dict() for a in store.list_approvals(status=None, run_id=record.run_id)
               if a.id in set(record.pending) or a.status == "pending"]
    steps = [{"number": s.get("number"), "kind": s.get("kind"), "code": s.get("code"),
              "observation": s.get("observation"), "error": s.get("error"),
              "calls": [{"tool": c.get("tool"), "args": c.get("args"), "status": c.get("status"),
                         "decision": (c.get("decision") or {}).get("outcome"),
                         "approval": c.get("approval")} for c in s.get("tool_calls") or ()]}
             for s in record.steps]
    return {"run": _run_summary(record), "steps": steps, "waiting": waiting,
            "calls": run_calls(store, record)}
