"""Answers refused by the inbox and the CLI, written to the run's audit trail (``approval_refused``).

An answer the inbox (`proctor serve`) or `proctor approvals … --store` refuses never reaches the gate, so
the gate's `approval_resolved` cannot tell of it: someone answering a call of their own run, someone
the policy's `approvers:` do not admit, an `--as` the policy's `approval.os_users` does not allow, an
answer to an approval no longer pending (expired, answered, voided) or bound to something else than
the approval is (a stale page, a forged binding), an answer that cannot be taken as given, and an
answer found in the store whose seal does not hold (code ``seal``: written there by hand; recorded by the
gate that read it, or by the inbox or CLI that found it in a real answer's way). Each is one
``approval_refused`` record in the trail the run writes to (`AuditTrail`): who tried (the name as
proven, how, from which address and OS account), what they tried (the verdict, and the binding they
echoed), the approval and its call, and why it was refused, in the words the refused answerer read.

A file log has one writer at a time (`proctor.audit.lockfile`): the trail is opened for each refusal and
closed at once, so a run that is not running holds nothing. While a run's process holds the log (it is
running, or waiting for an answer with ``InboxApprover(wait=…)``), the refusal cannot be written there:
the answer is refused all the same, and the refusal message says the record is missing and why. A
PostgreSQL trail (``postgresql://…?log=NAME``) takes writers from many processes at once.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any, Protocol

from proctor.audit.base import AuditSink
from proctor.backends import load_audit, scheme_of
from proctor.calls import JSONValue
from proctor.errors import AuditError, ProctorError
from proctor.store.base import PendingApproval, RunRecord
from proctor.store.seal import PURPOSE as SEAL_PURPOSE
from proctor.store.seal import StoreSeal
from proctor.telemetry.logging import get_logger

__all__ = ["REFUSAL_CODES", "AuditTrail", "RefusalSink", "SinkRefusals", "refusal_fields", "write_refusal"]

log = get_logger("proctor.store")

#: Why an answer was refused, as the record's `code` says it.
REFUSAL_CODES = (
    "four_eyes",  # the approver is the run's principal
    "not_admitted",  # the policy's `approvers:` do not admit the approver (groups, roles, not: principal)
    "identity",  # the store CLI: `--as` a name the policy's `approval.os_users` does not let the OS user act as
    "not_pending",  # the approval expired, was answered or was voided
    "binding",  # the answer echoes another binding than the approval's (a stale page, a forged answer)
    "invalid",  # the answer cannot be taken as given (no reason for a deny, edited arguments refused…)
    "seal",  # an answer in the store whose seal does not hold: not given by the inbox or the CLI (a store writer's)
)

#: The most characters of an answerer's own words kept in the record.
_WORDS = 2000


class RefusalSink(Protocol):
    """Where refused answers are recorded; `record` returns None once the record is durable, else why not."""

    def record(self, fields: Mapping[str, JSONValue]) -> str | None: ...


class AuditTrail:
    """The audit trail at `url` (a path or ``postgresql://…?log=NAME``, as ``proctor run --audit`` takes it),
    opened for each record and closed again (refused answers; `proctor runs cancel`'s ``run_finished``).
    `signing_key` signs its checkpoints (default
    ``$PROCTOR_AUDIT_KEY``, as for `proctor run`)."""

    def __init__(self, url: str, signing_key: str | None = None, *, lock_wait_s: float = 2.0) -> None:
        self.url = url
        self.signing_key = signing_key
        self.lock_wait_s = lock_wait_s

    def __repr__(self) -> str:
        from proctor.urls import shown_url

        return f"AuditTrail({shown_url(self.url, query=False)!r})"

    def record(self, fields: Mapping[str, Any]) -> str | None:
        return self.append("approval_refused", fields)

    def append(self, kind: str, fields: Mapping[str, Any], *, of_run: RunRecord | None = None) -> str | None:
        """Append one `kind` record, durably; None once it is, else why not. With `of_run`, only to that run's
        own trail: one that exists, under whose key the run's saved record is sealed (a record about a run
        written into another trail would tell of a run that trail never saw)."""
        if of_run is not None and scheme_of("audit", self.url) == "file" and not os.path.isfile(self.url):
            return f"there is no audit trail at {self.url} (give the run's own with --audit)"
        deadline = time.monotonic() + self.lock_wait_s
        while True:
            try:
                sink, _, _ = load_audit(self.url, self.signing_key)
                assert sink is not None
                try:
                    if of_run is not None and StoreSeal(sink.key_for(SEAL_PURPOSE)).record_problem(of_run):
                        return (f"{self!r} is not the audit trail of run {of_run.run_id} (the run's record is not "
                                "sealed under its key): give the run's own with --audit")
                    result = sink.append(kind, dict(fields), durable=True)
                finally:
                    sink.close()
                return None if result.ok else str(result.error)
            except AuditError as exc:  # another writer holds a file log: a CLI a moment ago, or a live run
                if "locked by another writer" not in str(exc) or time.monotonic() >= deadline:
                    return str(exc)
                time.sleep(0.05)
            except ProctorError as exc:  # a corrupt log, an unreachable database, a missing extra
                return str(exc)


class SinkRefusals:
    """Refusals appended to an audit sink the process holds open already (the inbox's, when it sets halts)."""

    def __init__(self, sink: AuditSink) -> None:
        self.sink = sink

    def record(self, fields: Mapping[str, Any]) -> str | None:
        result = self.sink.append("approval_refused", dict(fields), durable=True)
        return None if result.ok else str(result.error)


def refusal_fields(approval: PendingApproval | None, approval_id: str, *, code: str, reason: str,
                   approver: str, method: str, address: str, os_user: str, decision: str, binding: str,
                   words: str = "", groups: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The `approval_refused` record of one refused answer (`approval` None: it could not be read)."""
    return {
        "approval_id": approval_id,
        "run_id": approval.run_id if approval is not None else None,
        "call_id": approval.call_id if approval is not None else None,
        "tool": approval.tool if approval is not None else None,
        "approval_status": approval.status if approval is not None else None,
        "binding": approval.binding if approval is not None else None,
        "answered_binding": binding,
        "code": code,
        "reason": reason,
        "decision": decision,
        "approver": approver,
        "method": method,
        "groups": list(groups) if groups is not None else None,
        "address": address,
        "os_user": os_user,
        "answer_reason": words[:_WORDS],
        "refused_at_ns": time.time_ns(),
    }


def write_refusal(sink: RefusalSink | None, fields: Mapping[str, Any]) -> str:
    """Record a refusal; "" when recorded (or no sink was given: the log line below stands alone), else a
    sentence to add to the refusal message saying the record is missing and why."""
    log.warning("approval_answer_refused", **{k: v for k, v in fields.items() if k != "answer_reason"})
    if sink is None:
        return ""
    try:
        problem = sink.record(fields)
    except Exception as exc:  # noqa: BLE001 - the answer is refused either way; say the record is missing
        problem = repr(exc)
    if problem is None:
        return ""
    log.error("approval_refusal_not_audited", approval_id=fields.get("approval_id"), error=problem)
    return f" (this refusal is not in the audit trail: {problem})"
