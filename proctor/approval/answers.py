"""Answering an approval: the checks every answer passes, from the inbox's pages and API and from the CLI.

An answer is taken only when: its verdict is one of ``approve | deny | edit | grant``;
a deny says why; the approver is not the run's principal (four eyes); the approver is one
the policy's `approvers:` admit (its groups as the caller proved them: the inbox from the
token file, the CLI from the policy's `approval.os_users`); it echoes the approval's
`binding` (a page loaded before the arguments or the policy changed cannot approve what it
did not show); edited arguments are an object the tool's schema accepts; a grant's patterns
are safe on free text. The store then takes it once, with how the approver was proven, sealed with the
run's answer key (`proctor.store.answerseal`): the only kind of answer the run's gate believes.

The approvers' specs read here are the copy filed with the approval: a convenience that refuses
early and says why. The gate checks the answer again with its own policy (`proctor.gate.approval`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from proctor.approval.base import Grant
from proctor.approval.grants import GrantPattern, describe_grant
from proctor.errors import ApprovalConflict, FourEyes, InvalidAnswer
from proctor.jsoninput import local_schema_validator
from proctor.policy.approvers import Answerer, ApproverRule, OsUser, os_answerer, refusal
from proctor.store.answerseal import AnswerCheck, AnswerSeal
from proctor.store.base import ApprovalAnswer, PendingApproval, RunStore
from proctor.store.refusals import RefusalSink, refusal_fields, write_refusal

__all__ = ["VERDICTS", "answer", "believed", "check_edit", "check_grant", "grant_preview", "os_identity",
           "take_back_forged"]

VERDICTS = ("approve", "deny", "edit", "grant")


def os_identity(approval: PendingApproval, os_user: str, acting_as: str | None, *,
                refusals: RefusalSink | None = None, decision: str = "", address: str = "") -> Answerer:
    """Who an answer from OS account `os_user` (`--as acting_as`) is, by the mapping filed with `approval`
    (the policy's `approval.os_users`); `FourEyes` naming the fix when the mapping does not allow it (and
    an ``approval_refused`` record in `refusals`)."""
    mapping = approval.approvers.get("os_users")
    users = {str(k): OsUser.from_dict(v) for k, v in mapping.items() if isinstance(v, Mapping)} \
        if isinstance(mapping, Mapping) else {}
    found = os_answerer(os_user, acting_as, users)
    if isinstance(found, str):
        message = f"approval {approval.id}: {found}"
        missing = write_refusal(refusals, refusal_fields(
            approval, approval.id, code="identity", reason=message, approver=acting_as or os_user,
            method="os-user", address=address, os_user=os_user, decision=decision, binding=approval.binding))
        raise FourEyes(message + missing)
    return found


def answer(store: RunStore, approval_id: str, *, approver: str, address: str, decision: str, binding: str,
           reason: str = "", args: Mapping[str, Any] | None = None,
           grant: Mapping[str, Any] | None = None, method: str = "", groups: tuple[str, ...] | None = None,
           os_user: str = "", refusals: RefusalSink | None = None, seal: AnswerSeal) -> PendingApproval:
    """Check, seal and store one answer; raise `InvalidAnswer`, `FourEyes` or `ApprovalConflict` otherwise.

    `method` says how `approver` was proven (`proctor.policy.approvers.METHODS`), `groups` the groups
    that proof gives it (None: unknown), `os_user` the OS account it answered from (the store CLI).
    Every refusal of an answer to an approval that exists is an ``approval_refused`` record in
    `refusals` (`proctor.store.refusals`): the run's audit trail. The stored answer carries its seal
    under `seal` (`proctor.store.answerseal`): the run's gate believes no other. An answer already in
    the store whose seal does not hold (written there by hand) is refused the same way and taken back,
    so that this one, from a real approver, is taken."""
    current: PendingApproval | None = None

    def refused(code: str, error: ApprovalConflict | InvalidAnswer) -> ApprovalConflict | InvalidAnswer:
        missing = write_refusal(refusals, refusal_fields(
            current, approval_id, code=code, reason=str(error), approver=approver, method=method or "unknown",
            address=address, os_user=os_user, decision=decision, binding=binding, words=reason, groups=groups))
        if missing:
            error.args = (f"{error}{missing}",)
        return error

    if decision not in VERDICTS:
        raise InvalidAnswer(f"decision must be one of {', '.join(VERDICTS)}, got {decision!r}")
    current = store.get_approval(approval_id)  # (an unknown id is refused here: there is no call to name)
    current = believed(store, current, seal, refusals)  # a hand-written answer: the approval still waits for one
    words = reason.strip()
    if decision == "deny" and not words:
        raise refused("invalid", InvalidAnswer("a deny needs a reason: the program (and the model) are told why"))
    if current.principal is not None and current.principal == approver:
        raise refused("four_eyes", FourEyes(f"{approver} is the principal of run {current.run_id} and cannot answer "
                                            "its calls (four eyes): ask another approver"))
    if current.status != "pending":  # (before who may answer: nobody may now, and that is the reason to give)
        raise refused("not_pending", ApprovalConflict(f"approval {approval_id} is already {current.status}"))
    specs = [ApproverRule.from_dict(s) for s in current.approvers.get("require") or () if isinstance(s, Mapping)]
    not_admitted = refusal(Answerer(approver, method or "unknown", groups, os_user), specs, current.principal)
    if not_admitted is not None:
        raise refused("not_admitted", FourEyes(f"approval {approval_id}: {not_admitted}"))
    if binding != current.binding:
        raise refused("binding", ApprovalConflict(f"approval {approval_id} changed since the page was loaded "
                                                  "(binding mismatch): reload it and decide again"))
    edited: dict[str, Any] | None = None
    granted: dict[str, Any] | None = None
    try:
        if decision == "edit":
            if not isinstance(args, Mapping):
                raise InvalidAnswer("an edit needs args: a JSON object of argument names to values")
            edited = check_edit(current, args)
        if decision == "grant":
            granted = check_grant(current, grant)
    except InvalidAnswer as exc:
        raise refused("invalid", exc) from None
    stored = seal.sealed(current, ApprovalAnswer(decision, approver, words, edited, granted, time.time_ns(), address,
                                                  method, os_user, groups=list(groups) if groups is not None else None))
    try:
        return store.answer_approval(approval_id, stored, binding=binding)
    except ApprovalConflict as exc:  # answered, voided or expired since it was read (a race): refused there
        raise refused("not_pending", exc) from None


def believed(store: RunStore, approval: PendingApproval, seal: AnswerSeal,
             refusals: RefusalSink | None = None) -> PendingApproval:
    """`approval` as an answerer shows it: an answer whose seal does not hold under `seal` (written into
    the store by hand) is not an answer — refused (``approval_refused``, code ``seal``) and taken back, so
    the approval is shown pending and answerable, as the run's gate will take it when it reads it."""
    if approval.status != "answered" or approval.answer is None:
        return approval
    problem = seal.problem(approval)
    if problem is None:
        return approval
    AnswerCheck(seal, refusals).refuse(approval, problem)
    store.reopen_approval(approval.id, approval.answer)
    return store.get_approval(approval.id)


def take_back_forged(store: RunStore, seal: AnswerSeal, refusals: RefusalSink | None = None) -> None:
    """`believed` for every answered approval a suspended run waits for (what a list of pending ones must show)."""
    for record in store.list_runs(status="suspended"):
        waiting = set(record.pending)
        for approval in store.list_approvals(status="answered", run_id=record.run_id):
            if approval.id in waiting:
                believed(store, approval, seal, refusals)


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
        import referencing.exceptions
    except ImportError:  # the core install: the gate's own validation of the edited call still holds
        return edited
    if not schema:
        return edited

    shown = approval.shown_args if approval.shown_args is not None else approval.args  # what the page showed
    changed = {k: v for k, v in edited.items() if k not in shown or shown[k] != v}
    view = {**schema, "required": [r for r in schema.get("required", []) if r not in shown]}
    # The schema is the tool's (an MCP server's: anyone's): a `$ref` beyond it is never fetched, the edit refused.
    checker = local_schema_validator(view, jsonschema.Draft202012Validator)
    try:
        errors = sorted(checker.iter_errors(changed), key=lambda e: list(e.absolute_path))
    except referencing.exceptions.Unresolvable as exc:
        raise InvalidAnswer(f"edited arguments of {approval.tool}: the tool's schema refers to "
                            f"{str(exc.ref)[:300]!r}, outside itself (proctor resolves no such reference)") from None
    if errors:
        where = ".".join(str(p) for p in errors[0].absolute_path) or "arguments"
        raise InvalidAnswer(f"edited arguments of {approval.tool}: {where}: {errors[0].message}")
    missing = [r for r in schema.get("required", []) if r in shown and r not in edited]
    if missing:
        raise InvalidAnswer(f"edited arguments of {approval.tool}: missing {', '.join(missing)}")
    return edited


def check_grant(approval: PendingApproval, grant: Mapping[str, Any] | None) -> dict[str, Any]:
    """A grant ``{"args": {name: pattern}}`` whose patterns are safe on free text (`GrantPattern`)."""
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
    try:
        return describe_grant(Grant(approval.tool, dict(patterns)), approval.args)
    except ValueError as exc:
        raise InvalidAnswer(str(exc)) from None
