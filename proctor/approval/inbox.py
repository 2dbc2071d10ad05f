"""`InboxApprover`: approvals filed in the run store, answered from anywhere, later.

The request goes into the store (`RunStore.file_approval`), where `proctor approvals`,
the inbox (`proctor serve`) or Python (`store.answer_approval`) can answer it. The
approver waits `wait` for an answer; if none comes, it raises `RunSuspended` and the
run suspends (with an agent that has a store: `agent.run` returns ``status ==
"suspended"``; `agent.resume(run_id)` goes on once it is answered). A request for a
call that was already answered (the same call id, arguments and policy — the same
binding) is answered at once from the store: that is how a resumed run gets its answer.

An answer is believed only under its answerer's seal (`proctor.store.answerseal`): the gate asks
through `request_checked` with the run's answer key (its audit trail's, derived for answers). An answer
whose seal does not hold — written into the store by hand, changed, copied from another approval — is
refused (``approval_refused`` through the gate's recorder), taken back so that a real approver can
still answer, and the wait goes on (or the run suspends); nothing runs on it.

`wait` is bounded by the policy's ``approval.timeout``, which the gate enforces. The approval is
filed with its deadline (``expires_at_ns``: the policy's timeout from the first time it was
asked): past it the store reads it as ``expired`` and takes no answer, and a resumed run gets
the policy's ``on_timeout`` for the call (deny), however long it was suspended.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from proctor.approval.base import ApprovalDecision, ApprovalRequest, Grant
from proctor.canonical import json_shaped
from proctor.durations import parse_duration
from proctor.errors import RunSuspended
from proctor.store.answerseal import AnswerCheck
from proctor.store.base import PendingApproval, RunStore
from proctor.telemetry.logging import get_logger

__all__ = ["InboxApprover"]

log = get_logger("proctor.approval")

#: How many answers that are not believed one request takes back before it stops waiting (a store that
#: keeps writing them: the run suspends, and the approval is answerable by a real approver).
_MAX_REFUSED = 16


class InboxApprover:
    """Files each request in `store` and waits `wait` (``"0s"``, ``"30s"``, or seconds) before suspending."""

    def __init__(self, store: RunStore, *, wait: str | float = "0s") -> None:
        self.store = store
        self.wait_s = parse_duration(wait) if isinstance(wait, str) else float(wait)
        if self.wait_s < 0:
            raise ValueError("wait must not be negative")

    def __repr__(self) -> str:
        return f"InboxApprover({self.store!r}, wait={self.wait_s:g})"

    def request(self, request: ApprovalRequest) -> ApprovalDecision:
        """`request` outside a gate: filed, but no answer is believed (there is no run key to check it with)."""
        return self.request_checked(request, AnswerCheck(None, None))

    def request_checked(self, request: ApprovalRequest, answers: AnswerCheck) -> ApprovalDecision:
        stored = dict(request.redacted_args if request.redacted_args is not None else request.args)
        # What an approver may see: clear values, but for fields hidden from approvers too. Kept beside
        # the redacted `args` (which lists and the audit log carry) for the inbox and `approvals show`.
        shown = dict(request.args)
        at = request.position
        filed = self.store.file_approval(PendingApproval(
            id="", run_id=request.run.id, call_id=request.call_id, tool=request.tool, binding=request.binding,
            policy_sha256=request.policy_sha256, side_effect=request.side_effect,
            args=stored,
            step=request.run.step, seq=_seq_of(request.call_id), principal=request.run.principal,
            labels=dict(request.run.labels), rules=list(request.rules), reason=request.reason,
            budget=dict(request.budget), parameters=dict(request.parameters),
            # The deadline is the first request's: a resumed run asking again finds this one, deadline and all.
            expires_at_ns=request.expires_at_ns,
            shown_args=shown if shown != stored else None, spend=dict(request.spend),
            line=at.line if at is not None else None, col=at.col if at is not None else None,
            end_line=at.end_line if at is not None else None, end_col=at.end_col if at is not None else None,
            approvers={"require": [spec.as_dict() for spec in request.approvers],
                       "os_users": {name: u.as_dict() for name, u in request.os_users.items()}},
        ))
        def unbelieved(approval: PendingApproval) -> str | None:
            """Why the answer `approval` holds is not believed: its seal (`AnswerCheck`), or an approval that
            showed its answerer another call than this one (arguments edited in the store, the binding kept)."""
            problem = answers.problem(approval)
            if problem is None and approval.answer is not None and not _shows(approval, request.tool, stored, shown):
                problem = (f"approval {approval.id} ({approval.tool} of run {approval.run_id}): the answer "
                           f"{approval.answer.verdict} by {approval.answer.approver} was given to an approval that "
                           "shows other arguments than the call's (changed in the store); refused, the approval "
                           "waits for a real answer")
            return problem

        wait_s = self.wait_s
        if filed.expires_at_ns is not None:
            wait_s = max(0.0, min(wait_s, (filed.expires_at_ns - time.time_ns()) / 1e9))
        until = time.monotonic() + wait_s
        refused = 0
        while True:
            if filed.status == "answered" and filed.answer is not None:
                problem = unbelieved(filed)
                if problem is None:
                    break
                if answers.seal is None:  # nothing can be believed here: refused, and left for a gate that can
                    return ApprovalDecision.deny(request, "inbox", problem)
                # Not an answer: recorded, taken back (the approval waits for a real approver, until its
                # deadline), and the wait goes on. A store that keeps writing them only uses up the wait.
                missing = answers.refuse(filed, problem)
                log.warning("approval_answer_not_believed", approval_id=filed.id, reason=problem + missing)
                refused += 1
                self.store.reopen_approval(filed.id, filed.answer)
                filed = self.store.get_approval(filed.id)
                if refused < _MAX_REFUSED:
                    continue
            left = until - time.monotonic()
            if filed.status != "pending" or left <= 0 or refused >= _MAX_REFUSED:
                break
            filed = self.store.wait_for_answer(filed.id, left)
            if filed.status == "pending":
                break
        if filed.status == "void":
            return ApprovalDecision.deny(request, "inbox", f"approval {filed.id} was voided (the run was cancelled)")
        answer = filed.answer
        believed = filed.status == "answered" and answer is not None and unbelieved(filed) is None
        late = (believed and filed.expires_at_ns is not None and answer is not None
                and answer.answered_at_ns > filed.expires_at_ns)
        if filed.status == "expired" or late:
            if filed.status == "expired":
                self.store.expire_approval(filed.id)
            return ApprovalDecision.deny(request, "timeout", f"approval {filed.id} expired before it was answered "
                                         "(the policy's approval timeout)", timed_out=True)
        if not believed or answer is None:
            raise RunSuspended(f"{request.tool}: waiting for approval {filed.id} (answer it with `proctor approvals "
                               f"approve {filed.id}`, then resume run {request.run.id})", tool=request.tool,
                               call_id=request.call_id, approval_id=filed.id)
        grant = None
        if answer.grant is not None:
            grant = Grant(str(answer.grant.get("tool", request.tool)), dict(answer.grant.get("args") or {}))
        verdict = answer.verdict if answer.verdict in ("approve", "deny", "edit", "grant") else "deny"
        # The audit record names who answered, how that was proven, from where and when (the store's
        # stamp of the answer, not the time a resumed run read it); the gate checks the approver again.
        return ApprovalDecision(verdict, filed.binding, answer.approver, answer.reason,  # type: ignore[arg-type]
                                dict(answer.args) if answer.args is not None else None, grant,
                                method=answer.method or "unknown", answered_at_ns=answer.answered_at_ns,
                                address=answer.address, os_user=answer.os_user)


def _shows(approval: PendingApproval, tool: str, stored: Mapping[str, Any], shown: Mapping[str, Any]) -> bool:
    """Whether `approval` shows its answerers the call as the gate asks about it: its tool, its arguments as the
    audit log holds them, and as approvers see them (the answer's seal covers what was shown)."""
    approvers_saw = approval.shown_args if approval.shown_args is not None else approval.args
    return (approval.tool == tool and json_shaped(approval.args) == json_shaped(stored)
            and json_shaped(approvers_saw) == json_shaped(shown))


def _seq_of(call_id: str) -> int:
    """A durable run's call id ends with the call's number in its step (`StepJournal.call_id`)."""
    tail = call_id.rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else 0
