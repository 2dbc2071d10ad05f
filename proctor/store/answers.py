"""Answering an approval: the checks every answer passes, from the inbox's pages and API and from the CLI.

An answer is taken only when: its verdict is one of ``approve | deny | edit | grant``;
a deny says why; the approver is not the run's principal (four eyes); it echoes the
approval's `binding` (a page loaded before the arguments or the policy changed cannot
approve what it did not show); edited arguments are an object the tool's schema
accepts; a grant's patterns are safe on free text. The store then takes it once.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from proctor.errors import ApprovalConflict, FourEyes, InvalidAnswer
from proctor.store.base import ApprovalAnswer, PendingApproval, RunStore

__all__ = ["VERDICTS", "answer", "check_edit", "grant_preview"]

VERDICTS = ("approve", "deny", "edit", "grant")


def answer(store: RunStore, approval_id: str, *, approver: str, address: str, decision: str, binding: str,
           reason: str = "", args: Mapping[str, Any] | None = None,
           grant: Mapping[str, Any] | None = None) -> PendingApproval:
    """Check and store one answer; raise `InvalidAnswer`, `FourEyes` or `ApprovalConflict` otherwise."""
    if decision not in VERDICTS:
        raise InvalidAnswer(f"decision must be one of {', '.join(VERDICTS)}, got {decision!r}")
    reason = reason.strip()
    if decision == "deny" and not reason:
        raise InvalidAnswer("a deny needs a reason: the program (and the model) are told why")
    current = store.get_approval(approval_id)
    if current.principal is not None and current.principal == approver:
        raise FourEyes(f"{approver} is the principal of run {current.run_id} and cannot answer its calls "
                       "(four eyes): ask another approver")
    if current.status != "pending":
        raise ApprovalConflict(f"approval {approval_id} is already {current.status}")
    if binding != current.binding:
        raise ApprovalConflict(f"approval {approval_id} changed since the page was loaded (binding mismatch): "
                               "reload it and decide again")
    edited: dict[str, Any] | None = None
    if decision == "edit":
        if not isinstance(args, Mapping):
            raise InvalidAnswer("an edit needs args: a JSON object of argument names to values")
        edited = check_edit(current, args)
    granted: dict[str, Any] | None = None
    if decision == "grant":
        patterns = (grant or {}).get("args", {}) if isinstance(grant, Mapping) else None
        if not isinstance(patterns, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                        for k, v in patterns.items()):
            raise InvalidAnswer("a grant needs {\"args\": {name: pattern}} with string patterns ({} grants the tool)")
        unknown = sorted(set(patterns) - set(current.parameters.get("properties", {}) or current.args))
        if unknown:
            raise InvalidAnswer(f"grant names no argument of {current.tool}: {', '.join(unknown)}")
        granted = {"tool": current.tool, "args": dict(patterns)}
    stored = ApprovalAnswer(decision, approver, reason, edited, granted, time.time_ns(), address)
    return store.answer_approval(approval_id, stored, binding=binding)


def check_edit(approval: PendingApproval, args: Mapping[str, Any]) -> dict[str, Any]:
    """Edited arguments checked against the tool's JSON Schema; `InvalidAnswer` naming what is wrong.

    Only what the approver changed is checked here: a field left as shown was valid when the
    program made the call, and one the policy hides from approvers shows a marker the gate puts
    back to the hidden value. The gate validates the whole edited call again before it runs.
    """
    edited = dict(args)
    schema = approval.parameters
    try:
        import jsonschema
    except ImportError:  # the core install: the gate's own validation of the edited call still holds
        return edited
    if not schema:
        return edited

    changed = {k: v for k, v in edited.items() if k not in approval.args or approval.args[k] != v}
    view = {**schema, "required": [r for r in schema.get("required", []) if r not in approval.args]}
    errors = sorted(jsonschema.Draft202012Validator(view).iter_errors(changed), key=lambda e: list(e.absolute_path))
    if errors:
        where = ".".join(str(p) for p in errors[0].absolute_path) or "arguments"
        raise InvalidAnswer(f"edited arguments of {approval.tool}: {where}: {errors[0].message}")
    missing = [r for r in schema.get("required", []) if r in approval.args and r not in edited]
    if missing:
        raise InvalidAnswer(f"edited arguments of {approval.tool}: missing {', '.join(missing)}")
    return edited


def grant_preview(tool: str, patterns: Mapping[str, str]) -> str:
    """What a grant admits, in words, shown before it is given."""
    if not patterns:
        return f"every later call of {tool} in this run, with any arguments"
    parts = [f"{name} matches {pattern!r}" for name, pattern in sorted(patterns.items())]
    return (f"later calls of {tool} in this run where " + " and ".join(parts)
            + " (a * never matches whitespace, control characters, , ; < > \" ' or @)")
