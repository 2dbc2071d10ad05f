"""A shadow policy decides every call beside the enforced one, is audited where it disagrees, and never acts."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from proctor.errors import ToolDenied
from proctor.gate import Gate
from proctor.policy import Policy
from proctor.telemetry import metrics
from proctor.testing import InMemoryAudit, SpanCapture
from proctor.tools import tool

SENT: list[str] = []


@tool(side_effect="external")
def send_email(to: str, body: str = "") -> str:
    """Send a mail.

    Args:
        to: Recipient.
        body: Text.
    """
    SENT.append(to)
    return "sent"


@tool(side_effect="read")
def lookup(order: str) -> str:
    """Look an order up.

    Args:
        order: Order id.
    """
    return f"order {order}"


ENFORCED = {"version": 1, "rules": [{"name": "mail", "match": {"tool": "send_email"}, "decision": "allow"},
                                     {"name": "reads", "match": {"side_effect": "read"}, "decision": "allow"}]}
CANDIDATE = {"version": 1,
             "budgets": [{"name": "one-mail", "match": {"tool": "send_email"}, "limit": {"calls": 2}}],
             "rules": [{"name": "internal-only", "match": {"tool": "send_email"},
                        "when": "!args.to.endsWith('@example.com')", "decision": "deny",
                        "reason": "mail stays inside"},
                       {"name": "mail", "match": {"tool": "send_email"}, "decision": "allow"},
                       {"name": "reads", "match": {"side_effect": "read"}, "decision": "allow"}]}


@pytest.fixture(autouse=True)
def _clear() -> None:
    SENT.clear()


def _gate(audit: InMemoryAudit, shadow: dict[str, Any] = CANDIDATE, **kw: Any) -> Gate:
    return Gate(Policy.from_dict(ENFORCED), audit=audit, shadow=Policy.from_dict(shadow),
                tools=[send_email, lookup], **kw)


def test_a_disagreement_is_audited_with_both_decisions_and_the_call_still_runs() -> None:
    audit = InMemoryAudit()
    gate = _gate(audit)
    ctx = gate.start_run(principal="alice")
    assert gate.call("send_email", {"to": "eve@evil.example"}, context=ctx) == "sent"
    assert SENT == ["eve@evil.example"]
    (record,) = audit.of_kind("shadow_decision")
    assert record["enforced"] == {"decision": "allow", "rules": ["mail"], "reason": record["enforced"]["reason"],
                                  "budget": None}
    assert record["shadow"]["decision"] == "deny" and record["shadow"]["rules"] == ["internal-only"]
    assert record["shadow"]["reason"].endswith("mail stays inside")
    assert record["policy_sha256"] == gate.policy.sha256
    assert record["shadow_sha256"] == Policy.from_dict(CANDIDATE).sha256
    assert record["call_id"] == audit.of_kind("call_intent")[0]["call_id"]


def test_agreement_writes_nothing() -> None:
    audit = InMemoryAudit()
    gate = _gate(audit)
    ctx = gate.start_run()
    gate.call("send_email", {"to": "bob@example.com"}, context=ctx)
    gate.call("lookup", {"order": "1"}, context=ctx)
    assert audit.of_kind("shadow_decision") == []


def test_the_shadows_budgets_count_only_calls_that_went_on_and_name_the_budget() -> None:
    audit = InMemoryAudit()
    gate = _gate(audit)
    ctx = gate.start_run()
    for _ in range(3):
        gate.call("send_email", {"to": "bob@example.com"}, context=ctx)
    assert SENT == ["bob@example.com"] * 3  # the shadow never acts
    (record,) = audit.of_kind("shadow_decision")
    assert record["shadow"]["decision"] == "deny" and record["shadow"]["budget"] == "one-mail"
    # A new run starts the shadow's run budgets afresh.
    other = gate.start_run()
    gate.call("send_email", {"to": "bob@example.com"}, context=other)
    assert len(audit.of_kind("shadow_decision")) == 1


def test_an_enforced_refusal_the_shadow_would_allow_is_recorded_and_nothing_runs() -> None:
    audit = InMemoryAudit()
    gate = Gate(Policy.from_dict(CANDIDATE), audit=audit, shadow=Policy.from_dict(ENFORCED),
                tools=[send_email, lookup])
    ctx = gate.start_run()
    with pytest.raises(ToolDenied):
        gate.call("send_email", {"to": "eve@evil.example"}, context=ctx)
    assert SENT == []
    (record,) = audit.of_kind("shadow_decision")
    assert (record["enforced"]["decision"], record["shadow"]["decision"]) == ("deny", "allow")


def test_a_shadow_that_raises_changes_nothing() -> None:
    class Broken:
        def __init__(self) -> None:
            self.inner = Policy.from_dict(CANDIDATE)

        def facts(self, *args: Any) -> Any:
            raise RuntimeError("broken shadow")

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    audit = InMemoryAudit()
    gate = Gate(Policy.from_dict(ENFORCED), audit=audit, shadow=Broken(), tools=[send_email])  # type: ignore[arg-type]
    assert gate.call("send_email", {"to": "eve@evil.example"}) == "sent"
    assert audit.of_kind("shadow_decision") == []


def test_a_disagreement_is_a_span_event_and_a_metric() -> None:
    capture = SpanCapture()
    reader = InMemoryMetricReader()
    metrics.use_meter_provider(MeterProvider(metric_readers=[reader]))
    try:
        gate = _gate(InMemoryAudit(), tracer=capture.tracer)
        gate.call("send_email", {"to": "eve@evil.example"})
        gate.call("send_email", {"to": "bob@example.com"})
        (span, _) = capture.spans("execute_tool")
        (event,) = [e for e in span.events if e.name == "proctor.shadow_decision"]
        assert event.attributes is not None
        assert (event.attributes["proctor.decision"], event.attributes["proctor.shadow.decision"]) == ("allow", "deny")
        data = reader.get_metrics_data()
        points = [p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
                  if m.name == "proctor.shadow.disagreements" for p in m.data.data_points]
        assert [(p.attributes["proctor.decision"], p.attributes["proctor.shadow.decision"], p.value)
                for p in points] == [("allow", "deny", 1)]
    finally:
        metrics.use_meter_provider(None)
