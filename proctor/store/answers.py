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

__all__ = ["VERDICTS", "answer", "check_edit", "check_grant", "grant_preview"]

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
        granted = check_grant(current, grant)
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

    shown = approval.shown_args if approval.shown_args is not None else approval.args  # what the page showed
    changed = {k: v for k, v in edited.items() if k not in shown or shown[k] != v}
    view = {**schema, "required": [r for r in schema.get("required", []) if r not in shown]}
    errors = sorted(jsonschema.Draft202012Validator(view).iter_errors(changed), key=lambda e: list(e.absolute_path))
    if errors:
        where = ".".join(str(p) for p in errors[0].absolute_path) or "arguments"
        raise InvalidAnswer(f"edited arguments of {approval.tool}: {where}: {errors[0].message}")
    missing = [r for r in schema.get("required", []) if r in shown and r not in edited]
    if missing:
        raise InvalidAnswer(f"edited arguments of {approval.tool}: missing {', '.join(missing)}")
    return edited


def check_grant(approval: PendingApproval, grant: Mapping[str, Any] | None) -> dict[str, Any]:
    """A grant ``{"args": {name: pattern}}`` whose patterns are safe on free text (`GrantPattern`)."""
    from proctor.approval.grants import GrantPattern

    patterns = grant.get("args", {}) if isinstance(grant, Mapping) else None
    if not isinstance(patterns, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in patterns.items()):
        raise InvalidAnswer('a grant needs {"args": {name: pattern}} with string patterns ({} grants the tool)')
    known = set(approval.parameters.get("properties", {})) or set(approval.args)
    unknown = sorted(set(patterns) - known)
    if unknown:
        raise InvalidAnswer(f"the grant names no argument of {approval.tool}: {', '.join(unknown)}")
    for text in patterns.values():
        try:
            GrantPattern.parse(text)
        except ValueError as exc:
            raise InvalidAnswer(str(exc)) from None
    return {"tool": approval.tool, "args": dict(patterns)}


def grant_preview(approval: PendingApproval, patterns: Mapping[str, str]) -> list[str]:
    """What a grant would admit, in words (and whether this call is covered), shown before it is given."""
    from proctor.approval.base import Grant
    from proctor.approval.grants import describe_grant

    try:
        return describe_grant(Grant(approval.tool, dict(patterns)), approval.args)
    except ValueError as exc:
        raise InvalidAnswer(str(exc)) from None
