"""Metrics recorded by the span handles: decisions, durations, approval waits, budgets, runs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from tel_helpers import make_gate, run_two_steps

from proctor.calls import Decision
from proctor.telemetry import metrics as proctor_metrics
from proctor.telemetry.spans import QuietSpan


@pytest.fixture
def reader() -> Iterator[InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    proctor_metrics.use_meter_provider(provider)
    try:
        yield reader
    finally:
        proctor_metrics.use_meter_provider(None)
        provider.shutdown()


def _points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    assert data is not None
    out: dict[str, list[Any]] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).extend(m.data.data_points)
    return out


def test_metrics_of_a_run(reader: InMemoryMetricReader) -> None:
    """A run's calls are counted by decision and status, timed, and its approvals, budgets and steps recorded."""
    run_two_steps(None, make_gate(None))  # no tracer provider at all: metrics work without spans
    points = _points(reader)

    decisions = {(p.attributes["gen_ai.tool.name"], p.attributes["proctor.decision"], p.attributes["proctor.status"],
                  p.attributes.get("error.type")): p.value for p in points["proctor.decisions"]}
    assert decisions == {
        ("lookup", "allow", "ok", None): 1,
        ("wipe", "deny", "denied", "ToolDenied"): 1,
        ("send_email", "require_approval", "ok", None): 1,
        ("broken", "allow", "failed", "ValueError"): 1,
    }
    side_effects = {p.attributes["gen_ai.tool.name"]: p.attributes["proctor.side_effect"]
                    for p in points["proctor.decisions"]}
    assert side_effects == {"lookup": "read", "wipe": "destructive", "send_email": "external", "broken": "read"}

    durations = {p.attributes["gen_ai.tool.name"]: p for p in points["gen_ai.execute_tool.duration"]}
    assert set(durations) == {"lookup", "wipe", "send_email", "broken"}
    assert all(p.count == 1 and 0 < p.sum < 5 for p in durations.values())
    assert durations["lookup"].attributes["gen_ai.operation.name"] == "execute_tool"
    # Sub-millisecond buckets, because an allowed call through the gate takes tens of microseconds.
    assert durations["lookup"].explicit_bounds[0] == 0.0001

    (wait,) = points["proctor.approval.wait"]
    assert wait.attributes == {"gen_ai.tool.name": "send_email", "proctor.approval.outcome": "approve"}
    (budget,) = points["proctor.budget.remaining"]
    assert budget.value == 2 and budget.attributes == {"proctor.budget.name": "mail", "proctor.budget.kind": "calls"}

    (agent,) = points["gen_ai.invoke_agent.duration"]
    assert agent.count == 1 and agent.attributes["gen_ai.agent.name"] == "support"
    assert sum(p.value for p in points["proctor.steps"]) == 2


def test_unknown_tool_counts_as_refused_without_decision(reader: InMemoryMetricReader) -> None:
    """A call refused before any decision (unknown tool) is counted with decision `none`."""
    make_gate(None).submit("nope", {})
    (point,) = _points(reader)["proctor.decisions"]
    assert point.attributes["proctor.decision"] == "none" and point.attributes["proctor.status"] == "denied"


def test_a_quiet_span_hands_on_approval_and_budget_metrics_but_records_nothing_else(
        reader: InMemoryMetricReader) -> None:
    """A call opened while nothing received spans or metrics (QuietSpan) still reports a human's wait and budgets."""
    with QuietSpan("send_email", "call_1", "run_1") as span:
        span.decision(Decision("allow", (), "ok", "sha"), "external")
        span.approval("approve", "human", 2_000_000)
        span.budget({"mail": {"calls": 2}})
        span.finish("ok")
    points = _points(reader)
    (wait,) = points["proctor.approval.wait"]
    assert wait.attributes == {"gen_ai.tool.name": "send_email", "proctor.approval.outcome": "approve"}
    (budget,) = points["proctor.budget.remaining"]
    assert budget.value == 2
    assert "proctor.decisions" not in points  # its decision and end go nowhere: nobody was listening when it began
    assert span.log_fields() == {"run_id": "run_1", "call_id": "call_1"} and span.trace_id is None


def test_calls_made_after_a_meter_provider_is_set_are_counted(reader: InMemoryMetricReader) -> None:
    """The gate asks at each call whether metrics are received: a provider set between calls counts the next one."""
    gate = make_gate(None)
    proctor_metrics.use_meter_provider(None)
    gate.submit("lookup", {"order": "A1"})  # no provider: a quiet span
    provider = MeterProvider(metric_readers=[late := InMemoryMetricReader()], shutdown_on_exit=False)
    proctor_metrics.use_meter_provider(provider)
    try:
        gate.submit("lookup", {"order": "A1"})
        (point,) = _points(late)["proctor.decisions"]
        assert point.value == 1 and point.attributes["gen_ai.tool.name"] == "lookup"
    finally:
        provider.shutdown()
