"""The gate's per-call state machine: a fault at every step, and interrupts, end each call as its state allows."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any

import pytest

from proctor.approval import ApprovalDecision, ApprovalRequest, CallbackApprover
from proctor.audit.base import AuditResult
from proctor.errors import ApprovalDenied, AuditError, ToolDenied, ToolFailed
from proctor.gate import Gate
from proctor.policy import Policy
from proctor.telemetry.spans import ToolSpan
from proctor.testing import InMemoryAudit, SpanCapture
from proctor.tools import Tool, tool

RUNS: Counter[str] = Counter()


@tool(side_effect="external", cost=1)
def send(to: str) -> str:
    """Send something.

    Args:
        to: Recipient.
    """
    RUNS["send"] += 1
    if to == "boom":
        raise ValueError("the tool failed")
    return f"sent to {to}"


POLICY: dict[str, Any] = {
    "version": 1,
    "default": "deny",
    "budgets": [{"name": "sends", "match": {"tool": "send"}, "limit": {"calls": 5}}],
    "rules": [
        {"name": "internal", "match": {"tool": "send"}, "when": "!args.to.startsWith('ext')", "decision": "allow"},
        {"name": "external", "match": {"tool": "send"}, "when": "args.to.startsWith('ext')",
         "decision": "require_approval"},
    ],
    "approval": {"timeout": "5s"},
}


class Fault(Exception):
    """The injected fault."""


class FaultyLedger:
    """A budget ledger that raises at the step named by `fault`."""

    def __init__(self, inner: Any, fault: str) -> None:
        self.inner, self.fault = inner, fault

    def reserve(self, *args: Any, **kwargs: Any) -> Any:
        if self.fault == "reserve":
            raise Fault("ledger reserve failed")
        return self.inner.reserve(*args, **kwargs)

    def settle(self, *args: Any, **kwargs: Any) -> None:
        if self.fault == "settle":
            raise Fault("ledger settle failed")
        self.inner.settle(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class FaultyPolicy:
    """A policy that raises at the step named by `fault` (and hands out a faulty ledger)."""

    def __init__(self, fault: str) -> None:
        self.inner, self.fault = Policy.from_dict(POLICY), fault

    def decide(self, call: Any) -> Any:
        if self.fault == "policy":
            raise Fault("policy failed")
        return self.inner.decide(call)

    def fixed_decision(self, *args: Any) -> Any:
        if self.fault == "policy":
            raise Fault("policy failed")
        return self.inner.fixed_decision(*args)

    def facts(self, *args: Any) -> Any:
        if self.fault == "facts":
            raise Fault("facts failed")
        return self.inner.facts(*args)

    def new_ledger(self, *args: Any, **kwargs: Any) -> Any:
        return FaultyLedger(self.inner.new_ledger(*args, **kwargs), self.fault)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class FaultyAudit(InMemoryAudit):
    """An audit sink whose append raises for the kinds in `raise_on`."""

    def __init__(self, raise_on: set[str]) -> None:
        super().__init__()
        self.raise_on = raise_on

    def append(self, kind: str, fields: Any, *, durable: bool = True) -> AuditResult:
        if kind in self.raise_on:
            raise Fault(f"sink failed writing {kind}")
        return super().append(kind, fields, durable=durable)


def approve(request: ApprovalRequest) -> ApprovalDecision:
    return ApprovalDecision.approve(request, "carol")


@pytest.fixture(autouse=True)
def _reset_runs() -> None:
    RUNS.clear()


@pytest.fixture
def broken_describe(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def describe(self: ToolSpan, description: str) -> None:
        raise Fault("span setter failed")

    monkeypatch.setattr(ToolSpan, "describe", describe)
    yield


class RaisingProcessor:
    """A span processor whose on_end raises: the export of every span fails."""

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        pass

    def on_end(self, span: Any) -> None:
        raise Fault("span export failed")

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _outcomes(audit: InMemoryAudit, call_id: str) -> list[str]:
    return [r["status"] for r in audit.of_kind("call_outcome") if r["call_id"] == call_id]


# (fault, target, expected status, error type, did the tool run)
CASES = [
    ("validation", "a@x", "denied", ToolDenied, 0),
    ("facts", "a@x", "denied", ToolDenied, 0),
    ("policy", "a@x", "denied", ToolDenied, 0),
    ("reserve", "a@x", "denied", ToolDenied, 0),
    ("approver", "ext@x", "denied", ApprovalDenied, 0),
    ("intent", "a@x", "denied", AuditError, 0),
    ("intent_raises", "a@x", "denied", AuditError, 0),
    ("tool", "boom", "failed", ToolFailed, 1),
    ("settle", "a@x", "ok", None, 1),
    ("outcome", "a@x", "ok", None, 1),
    ("outcome_raises", "a@x", "ok", None, 1),
    ("span_setter", "a@x", "ok", None, 1),
    ("span_export", "a@x", "ok", None, 1),
    ("on_result", "a@x", "ok", None, 1),
]


@pytest.mark.parametrize(("fault", "to", "status", "error_type", "ran"), CASES, ids=[c[0] for c in CASES])
def test_a_fault_at_every_step_ends_the_call_as_its_state_allows(
    fault: str, to: str, status: str, error_type: type[Exception] | None, ran: int, request: pytest.FixtureRequest
) -> None:
    """submit returns (never raises); a call whose tool ran is never recorded denied; audit matches the outcome."""
    audit: InMemoryAudit = InMemoryAudit(fail_on={"call_intent"} if fault == "intent" else
                                         {"call_outcome"} if fault == "outcome" else ())
    if fault in ("intent_raises", "outcome_raises"):
        audit = FaultyAudit({"call_intent" if fault == "intent_raises" else "call_outcome"})
    tracer = None
    if fault in ("span_export", "span_setter"):  # recording spans: a non-recording span skips its setters
        capture = SpanCapture()
        if fault == "span_export":
            capture.provider.add_span_processor(RaisingProcessor())  # type: ignore[arg-type]
        tracer = capture.tracer
    if fault == "span_setter":
        request.getfixturevalue("broken_describe")

    def approver(req: ApprovalRequest) -> ApprovalDecision:
        if fault == "approver":
            raise Fault("approver failed")
        return approve(req)

    gate = Gate(FaultyPolicy(fault), approver=CallbackApprover(approver), audit=audit,  # type: ignore[arg-type]
                tracer=tracer)
    gate.register(_ValidationFault(**{f.name: getattr(send, f.name) for f in fields(send)})
                  if fault == "validation" else send)
    on_result = None
    if fault == "on_result":
        def on_result(value: Any, error: Any) -> None:
            raise Fault("on_result failed")

    outcome = gate.submit("send", {"to": to}, call_id="c1", on_result=on_result)
    assert outcome.record.status == status
    assert RUNS["send"] == ran
    if error_type is None:
        assert outcome.error is None and outcome.value == f"sent to {to}"
    else:
        assert isinstance(outcome.error, error_type)
    recorded = _outcomes(audit, "c1")
    if fault in ("outcome", "outcome_raises"):
        assert recorded == []  # the write failed; the call still ended ok
    elif fault in ("intent", "intent_raises"):
        assert recorded == []  # the sink failed: nothing could be written, and nothing ran
    else:
        assert recorded == [status]
        assert [r["call_id"] for r in audit.of_kind("call_intent")] == ["c1"]
    if ran:
        assert "denied" not in recorded and outcome.record.status != "denied"
    if fault == "approver":
        assert [r["verdict"] for r in audit.of_kind("approval_resolved")] == ["denied"]


@dataclass(frozen=True, eq=False)
class _ValidationFault(Tool):
    """A tool whose argument validation raises something unexpected."""

    def validate(self, args: Any) -> Any:
        raise Fault("validation failed")


def test_submit_does_not_raise_when_the_run_cannot_be_opened() -> None:
    """A sink failing on run_started (default_context) gives a refused, unrecorded call, not an exception."""
    audit = FaultyAudit({"run_started"})
    gate = Gate(Policy.from_dict(POLICY), audit=audit, tools=[send])
    outcome = gate.submit("send", {"to": "a@x"})
    assert outcome.record.status == "denied" and isinstance(outcome.error, AuditError)
    assert RUNS["send"] == 0


def test_an_interrupt_while_the_tool_runs_ends_the_call_unknown() -> None:
    """KeyboardInterrupt while the tool runs is re-raised after an `unknown` outcome is written."""
    audit = InMemoryAudit()

    @tool(side_effect="read")
    def hang() -> str:
        """Interrupted while running."""
        raise KeyboardInterrupt

    gate = Gate(Policy.from_dict({**POLICY, "rules": [{"name": "all", "match": {"tool": "*"}, "decision": "allow"}]}),
                audit=audit, tools=[hang])
    ctx = gate.start_run()
    with pytest.raises(KeyboardInterrupt):
        gate.submit("hang", {}, context=ctx, call_id="c1")
    assert _outcomes(audit, "c1") == ["unknown"]
    assert [r.status for r in ctx.records] == ["unknown"]
    gate.finish_run(ctx, status="interrupted")
    assert audit.of_kind("run_finished")[0]["calls"]["unknown"] == 1


def test_an_interrupt_during_an_approval_wait_cancels_the_call_and_the_approval() -> None:
    """KeyboardInterrupt while waiting for a human: approval_resolved cancelled, outcome cancelled, re-raised."""
    audit = InMemoryAudit()
    asked = threading.Event()

    def approver(req: ApprovalRequest) -> ApprovalDecision:
        asked.set()
        raise KeyboardInterrupt  # carried back to the gate's thread, as a signal would arrive there

    gate = Gate(Policy.from_dict(POLICY), approver=CallbackApprover(approver), audit=audit, tools=[send])
    ctx = gate.start_run()
    with pytest.raises(KeyboardInterrupt):
        gate.submit("send", {"to": "ext@x"}, context=ctx, call_id="c1")
    assert asked.is_set() and RUNS["send"] == 0
    assert [r["verdict"] for r in audit.of_kind("approval_resolved")] == ["cancelled"]
    assert _outcomes(audit, "c1") == ["cancelled"]
    assert ctx.ledger.usage()["sends"]["calls"] == 0  # released: it cannot have run


def test_span_events_name_refusals_and_approvals() -> None:
    """A refused call and an approved call each carry span events saying so."""
    capture = SpanCapture()
    gate = Gate(Policy.from_dict(POLICY), approver=CallbackApprover(approve), tracer=capture.tracer, tools=[send])
    gate.submit("send", {"to": "ext@x"})
    gate.submit("nope", {})
    spans = capture.spans("execute_tool")
    events = {s.name: [e.name for e in s.events] for s in spans}
    assert events["execute_tool send"] == ["proctor.approval.requested", "proctor.approval.resolved"]
    assert events["execute_tool nope"] == ["proctor.call.refused"]
