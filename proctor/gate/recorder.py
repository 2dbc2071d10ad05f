"""The one writer of a call's life: its audit records, its span's end, its record in the run.

Every way a call ends goes through one method here — `refused` (it never ran), `finished`
(the tool returned: ok, failed, timeout), `interrupted` (unknown: it may have run;
cancelled: it had not), `replayed` (a resumed step answered it from the journal), `lost`
(the journal holds only its intent: a crash lost the outcome) and `diverged` (a resumed
program went another way). Each releases or settles the call's budget reservation, writes
what the audit trail must hold, ends the span and remembers the call in its run, and each
part is guarded on its own: nothing that fails here changes how the call ended. A call that
ran is written to a durable run's journal before its audit outcome (`finished`, `lost`), so
the log can say the store had it. The gate (`proctor.gate.gate`) and the journal (`proctor.gate.journal`) decide
*which* ending; only this module writes one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from proctor.audit.base import AuditResult, AuditSink
from proctor.calls import CallRecord, CallStatus, new_id
from proctor.errors import AuditError, BudgetExceeded, CallRefused, ProctorError, ToolFailed
from proctor.gate.call import Approval, CallOutcome, InFlight, agent_fields
from proctor.policy.budgets import UNCOUNTED
from proctor.redaction import Redacted, redact_args
from proctor.telemetry import semconv as sc
from proctor.telemetry.logging import get_logger
from proctor.telemetry.spans import ToolSpan
from proctor.textcaps import error_fields

__all__ = ["INTENT_WRITTEN", "Recorder", "log_fields", "safely"]

log = get_logger("proctor.gate")
ProctorErrorT = TypeVar("ProctorErrorT", bound=ProctorError)

#: States in which the call's intent record has been written.
INTENT_WRITTEN = frozenset({"intent", "running", "ran", "done"})


def safely(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Telemetry must never change how a call ends: run a span setter, log what it raises."""
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - see the docstring
        log.error("span_update_failed", method=getattr(fn, "__name__", "?"), error=repr(exc))


def log_fields(span: ToolSpan) -> dict[str, str]:
    """The span's ids for a log line (none when the span cannot say)."""
    try:
        return span.log_fields()
    except Exception:  # noqa: BLE001 - a log line without ids beats none
        return {}


class Recorder:
    """Writes the audit records of a gate's calls and runs, redacts what they show, and ends calls."""

    def __init__(self, audit: AuditSink | None) -> None:
        self.audit = audit
        # Without an audit sink the gate still redacts what it shows, with a key of its own.
        self._redaction_key = new_id().encode()

    # -- records --------------------------------------------------------------------------------

    def append(self, kind: str, fields: Mapping[str, Any], *, durable: bool = True,
               required: bool = False) -> AuditResult | None:
        """Append to the audit sink, if any (None without one); a failure raises only when `required`."""
        if self.audit is None:
            return None
        try:
            result = self.audit.append(kind, fields, durable=durable)
        except Exception as exc:  # noqa: BLE001 - sinks should not raise; treat it as a failed write
            result = AuditResult(ok=False, error=repr(exc))
        if not result.ok:
            log.error("audit_write_failed", kind=kind, error=result.error)
            if required:
                raise AuditError(f"the audit trail could not record {kind}: {result.error}")
        return result

    def about(self, p: InFlight, kind: str, fields: Mapping[str, Any]) -> AuditResult | None:
        """`append` a record about call `p`: a managed agent's carry its name (`agent_fields`)."""
        if p.ctx.parent_call_id is not None:
            fields = {**fields, **agent_fields(p.ctx)}
        return self.append(kind, fields)

    def intent(self, p: InFlight) -> AuditResult | None:
        """The call's intent, durable unless the policy lets its tool's intents be flushed."""
        return self.append("call_intent", self.call_fields(p), durable=p.facts.durability != "flush")

    def redact(self, args: Mapping[str, Any], fields: tuple[str, ...]) -> Redacted:
        """`args` as records, spans and approvers may show them (`fields` hidden behind keyed digests)."""
        if self.audit is not None:
            return self.audit.redact(args, fields)
        if not fields:  # nothing to hide and no digest to keep
            return Redacted(dict(args), "")
        # No audit trail: redact for spans and approvers, but no record will hold a digest.
        return redact_args(args, fields, self._redaction_key, digest=False)

    @staticmethod
    def clean(p: InFlight, error: ProctorErrorT) -> ProctorErrorT:
        """The error without any clear value of a redacted argument (its message may quote one)."""
        if p.ctx.secrets:
            text = str(error)
            cleaned = p.ctx.scrub(text)
            if cleaned != text:
                error.args = (cleaned,)
        return error

    def call_fields(self, p: InFlight) -> dict[str, Any]:
        d = p.decision
        fields = {
            "run_id": p.ctx.info.id, "step": p.ctx.info.step, "principal": p.ctx.info.principal,
            "call_id": p.call_id, "tool": p.name, "side_effect": p.side_effect,
            # the tool's own class, which the policy's `tools:` may have overridden (`side_effect`): replay decides
            # a call again under a policy without that override by what its gate would see
            "tool_side_effect": p.tool.side_effect,
            "args": p.redacted.args if p.redacted else {}, "args_digest": p.redacted.digest if p.redacted else None,
            "decision": d.outcome if d else None, "rules": list(d.rules) if d else [],
            "reason": d.reason if d else None, "policy_sha256": p.policy_sha256,
            "approval": p.approval.as_dict() if p.approval else None,
            "trace_id": p.span.trace_id, "span_id": p.span.span_id,
        }
        if p.tool.origin is not None:  # where the tool lives (an MCP server's `mcp:<name>`)
            fields["origin"] = p.tool.origin
        if p.ctx.parent_call_id is not None:
            fields.update(agent_fields(p.ctx))
            if p.ctx.layers:  # managed agents' own policies narrowed the decision: which ones, by fingerprint
                fields["layers"] = [{"agent": layer.agent, "policy_sha256": layer.policy.sha256}
                                    for layer in p.ctx.layers]
        return fields

    def outcome_fields(self, p: InFlight, status: CallStatus, error: ProctorError | None,
                       duration_ns: int) -> dict[str, Any]:
        fields = {"run_id": p.ctx.info.id, "call_id": p.call_id, "tool": p.name, "status": status,
                  "duration_ns": duration_ns, **error_fields(error if error else None),
                  "policy_sha256": p.policy_sha256, "trace_id": p.span.trace_id, "span_id": p.span.span_id}
        if p.ctx.parent_call_id is not None:
            fields.update(agent_fields(p.ctx))
        return fields

    def record_of(self, p: InFlight, status: CallStatus, error: ProctorError | None) -> CallRecord:
        """The call's entry of `tool_calls` (arguments as redacted)."""
        return CallRecord(
            p.call_id, p.name, p.redacted.args if p.redacted else {}, p.side_effect, p.decision, status,
            time.perf_counter_ns() - p.started_ns,  # duration_ns
            str(error) if error else None, type(error).__name__ if error else None,  # error, error_type
            _approval_summary(p.approval) if p.approval else None,  # approval
            error.budget if isinstance(error, BudgetExceeded) else None,  # budget
        )

    def remember(self, p: InFlight, status: CallStatus, error: ProctorError | None) -> CallRecord:
        """Add the call to its run (history, records, `seen`) and return its record."""
        record = self.record_of(p, status, error)
        p.ctx.remember(p.name, p.args, p.side_effect, p.decision.outcome if p.decision else "deny", status,
                       record, p.facts.labels)
        return record

    # -- endings --------------------------------------------------------------------------------

    def refused(self, p: InFlight, error: ProctorError, *, audited: bool = True,
                extra: Mapping[str, Any] | None = None) -> CallOutcome:
        """End a call that did not run: its intent (with `extra` fields) and a `denied` outcome."""
        error = self.clean(p, error)
        if p.reservation is not None:
            try:
                p.ctx.ledger.release(p.reservation)
            except Exception as exc:  # noqa: BLE001 - the refusal stands; the ledger may over-count
                log.error("budget_release_failed", tool=p.name, error=repr(exc), **log_fields(p.span))
            p.reservation = None
        if audited and self.audit is not None:
            fields = self.call_fields(p)
            fields.update(error_fields(error))  # capped, with the digest of what was cut
            if extra:
                fields.update(extra)
            self.append("call_intent", fields, durable=False)
            self.append("call_outcome", self.outcome_fields(p, "denied", error, 0), durable=False)
        if isinstance(error, CallRefused):
            safely(p.span.event, sc.CALL_REFUSED_EVENT, {sc.ERROR_TYPE: type(error).__name__,
                                                         sc.PROCTOR_REASON: str(error)})
        safely(p.span.finish, "denied", type(error).__name__, str(error))
        p.state = "done"
        record = self.remember(p, "denied", error)
        if p.journal is not None:
            p.journal.write_outcome(p, "denied", None, error, record)
        return CallOutcome(record, None, error)

    def finished(self, p: InFlight) -> CallOutcome:
        """End a call whose tool returned (`p.status`, `p.value`, `p.error`, already cleaned)."""
        name, error = p.name, p.error
        # (UNCOUNTED: nothing to settle, and a call with keywords less)
        if p.reservation is not None and p.reservation is not UNCOUNTED:
            try:
                p.ctx.ledger.settle(p.reservation, duration_ns=p.duration_ns)
            except Exception as exc:  # noqa: BLE001 - the budget may now under-count; say so
                log.error("budget_settle_failed", tool=name, error=repr(exc), **log_fields(p.span))
        record = self.remember(p, p.status, error)
        # A durable run's journal first, then the log: a call whose `done` entry is on stable storage gets an
        # outcome saying so (`journaled`), so a store that has it as anything else after that record was put
        # back, never lost in a crash (`proctor.store.trail`). (The intent still precedes the tool in both.)
        fields = self.outcome_fields(p, p.status, error, p.duration_ns)
        if p.journal is not None and p.journal.write_outcome(p, p.status, p.value, error, record):
            fields["journaled"] = True
        # Outcomes are written, not fsynced (docs/audit.md §3): the next durable record — the next
        # intent of a call with effects, a checkpoint, close — makes them durable before another tool
        # with effects runs; a power cut before that leaves the intent, which reopening closes `unknown`.
        # One fsync a call instead of two, shared between threads by group commit.
        outcome = self.append("call_outcome", fields, durable=False)
        if outcome is not None and not outcome.ok:
            # The tool already ran: its result stands, and the failed sink refuses every later intent.
            log.error("audit_outcome_lost", tool=name, error=outcome.error, **log_fields(p.span))
        span = p.span
        if error is None and span.recording and span.capturing:  # results get the policy's redaction too
            safely(span.result, p.value, redact=lambda v: self.redact(v, p.facts.redact).args)
        if error is None:
            safely(span.finish, p.status)
        else:
            safely(span.finish, p.status, error.error_type if isinstance(error, ToolFailed) else None, str(error))
        p.state = "done"
        return CallOutcome(record, p.value, error)

    def interrupted(self, p: InFlight, status: CallStatus, error: ProctorError) -> CallOutcome:
        """End a call as `unknown` (the tool started: it may have run) or `cancelled` (it had not)."""
        error = self.clean(p, error)
        if p.reservation is not None:
            try:
                if status == "unknown":  # it may have run: count it
                    p.ctx.ledger.settle(p.reservation, duration_ns=0)
                else:
                    p.ctx.ledger.release(p.reservation)
            except Exception as exc:  # noqa: BLE001 - logged; the ending is recorded regardless
                log.error("budget_settle_failed", tool=p.name, error=repr(exc), **log_fields(p.span))
            p.reservation = None
        if self.audit is not None:
            if p.state not in INTENT_WRITTEN:
                fields = self.call_fields(p)
                fields.update(error_fields(error))  # capped, with the digest of what was cut
                self.append("call_intent", fields, durable=False)
            self.append("call_outcome", self.outcome_fields(p, status, error, 0))
        safely(p.span.event, sc.CALL_INTERRUPTED_EVENT, {sc.PROCTOR_STATUS: status, sc.PROCTOR_REASON: str(error)})
        safely(p.span.finish, status, error.error_type if isinstance(error, ToolFailed) else type(error).__name__,
               str(error))
        p.state = "done"
        return CallOutcome(self.remember(p, status, error), None, error)

    def replayed(self, p: InFlight, record: CallRecord, value: Any, error: ProctorError | None) -> CallOutcome:
        """End a call answered from a resumed step's journal (its `call_replayed` record is the journal's
        batch, `flush`ed by it); the run's history and budgets were restored by the journal."""
        safely(p.span.span.set_attribute, "proctor.replayed", True)
        safely(p.span.finish, record.status, type(error).__name__ if error else None, str(error) if error else None)
        p.state = "done"
        return CallOutcome(record, value, error)

    def lost(self, p: InFlight, record: CallRecord, error: ProctorError, *, journaled: bool) -> CallOutcome:
        """End a call whose process died while its tool ran: close the intent it left in the trail
        (`journaled`: the journal's `done` for it is on stable storage already, as `finished` says)."""
        fields: dict[str, Any] = {"run_id": p.ctx.info.id, "call_id": p.call_id, "tool": p.name, "status": "failed",
                                  "duration_ns": 0, "error": str(error), "policy_sha256": p.policy_sha256,
                                  "trace_id": p.span.trace_id, "span_id": p.span.span_id}
        if journaled:
            fields["journaled"] = True
        self.append("call_outcome", fields)
        safely(p.span.finish, "failed", "ToolFailed", str(error))
        p.state = "done"
        return CallOutcome(record, None, error)

    def diverged(self, p: InFlight, error: ProctorError, fields: Mapping[str, Any]) -> CallOutcome:
        """End a call of a resumed program that went another way than the journal: `replay_diverged`
        (with `fields` saying where and what was expected), nothing run."""
        self.append("replay_diverged", fields)
        safely(p.span.finish, "denied", type(error).__name__, str(error))
        shown = self.redact(p.args, p.facts.redact).args
        record = CallRecord(p.call_id, p.name, shown, p.side_effect, None, "denied", 0, str(error),
                            type(error).__name__)
        p.state = "done"
        return CallOutcome(record, None, error)


def _approval_summary(approval: Approval) -> str:
    """`approve by bob from 127.0.0.1`: the verdict, who, and where from when known."""
    where = f" from {approval.address}" if approval.address else ""
    return f"{approval.verdict} by {approval.approver}{where}"
