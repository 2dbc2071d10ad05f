"""End to end: a run's spans and metrics through the real OTLP exporters to receivers decoding the protobuf."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status as PbStatus
from otlp_receivers import GotSpan, GrpcReceiver, HttpReceiver
from tel_helpers import make_gate, run_two_steps

from proctor.telemetry import metrics as proctor_metrics
from proctor.telemetry import setup


@pytest.fixture(params=["http/protobuf", "grpc"])
def receiver(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any]]:
    recv: Any = HttpReceiver() if request.param == "http/protobuf" else GrpcReceiver()
    try:
        yield request.param, recv
    finally:
        recv.close()


@pytest.fixture(autouse=True)
def _restore_meter() -> Iterator[None]:
    yield
    proctor_metrics.use_meter_provider(None)


def _by_name(spans: list[GotSpan], prefix: str) -> list[GotSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def test_run_tree_arrives_over_otlp(receiver: tuple[str, Any]) -> None:
    """One invoke_agent, its two steps, one execute_tool per call with the right parents, attributes and statuses."""
    protocol, recv = receiver
    provider = setup.configure_tracing(otlp_endpoint=recv.endpoint, protocol=protocol, service_name="proctor-test",
                                       set_global=False)
    assert provider is not None
    telemetry = setup.current()
    assert telemetry is not None and telemetry.protocol == protocol
    tracer = provider.get_tracer("proctor")
    run_id = run_two_steps(tracer, make_gate(tracer))
    assert telemetry.shutdown(timeout_s=10)  # flushes spans and the final metric export

    spans = recv.wait_for(lambda got: len(got) >= 8)
    (agent,) = _by_name(spans, "invoke_agent")
    steps = sorted(_by_name(spans, "step "), key=lambda s: s.start_ns)
    tools = _by_name(spans, "execute_tool ")
    approvals = _by_name(spans, "approval ")
    assert agent.name == "invoke_agent support"
    assert [s.name for s in steps] == ["step 1", "step 2"]
    assert sorted(s.name for s in tools) == ["execute_tool broken", "execute_tool lookup",
                                             "execute_tool send_email", "execute_tool wipe"]
    assert len(approvals) == 1 and approvals[0].name == "approval send_email"
    assert len({s.trace_id for s in spans}) == 1
    assert agent.resource["service.name"] == "proctor-test"
    assert len(agent.resource["service.instance.id"]) == 36  # one per process: Prometheus keeps runs apart

    # Parent links: agent is the root; steps under it; each call under its step; the wait under its call.
    assert agent.parent_id is None
    assert all(s.parent_id == agent.span_id for s in steps)
    by_tool = {s.attributes["gen_ai.tool.name"]: s for s in tools}
    assert by_tool["lookup"].parent_id == steps[0].span_id and by_tool["wipe"].parent_id == steps[0].span_id
    assert by_tool["send_email"].parent_id == steps[1].span_id and by_tool["broken"].parent_id == steps[1].span_id
    assert approvals[0].parent_id == by_tool["send_email"].span_id

    # Kinds: everything is INTERNAL, as the conventions say for in-process agents and tools.
    assert {s.kind for s in spans} == {PbSpan.SpanKind.SPAN_KIND_INTERNAL}

    # The agent span.
    a = agent.attributes
    assert a["gen_ai.operation.name"] == "invoke_agent" and a["gen_ai.agent.name"] == "support"
    assert a["gen_ai.provider.name"] == "ollama" and a["gen_ai.request.model"] == "ollama_chat/qwen2.5-coder:7b"
    assert a["gen_ai.conversation.id"] == run_id == a["proctor.run.id"]
    assert a["gen_ai.usage.input_tokens"] == 250 and a["gen_ai.usage.output_tokens"] == 50
    assert a["proctor.run.principal"] == "alice" and a["proctor.run.labels.env"] == "test"
    assert agent.status_code == PbStatus.STATUS_CODE_UNSET
    assert steps[0].attributes["proctor.step"] == 1 and steps[1].attributes["proctor.step"] == 2

    # An allowed call.
    ok = by_tool["lookup"].attributes
    assert ok["gen_ai.operation.name"] == "execute_tool" and ok["gen_ai.tool.type"] == "function"
    assert ok["gen_ai.tool.call.id"].startswith("call_")
    assert ok["proctor.decision"] == "allow" and ok["proctor.rules"] == ["reads"]
    assert ok["proctor.side_effect"] == "read" and ok["proctor.status"] == "ok"
    assert ok["proctor.run.id"] == run_id and ok["proctor.run.step"] == 1
    assert len(ok["proctor.policy.sha256"]) == 64
    assert "gen_ai.tool.call.arguments" not in ok and "gen_ai.tool.call.result" not in ok  # capture is off
    assert by_tool["lookup"].status_code == PbStatus.STATUS_CODE_UNSET

    # A denied call: ERROR with error.type, the rule and reason named.
    denied = by_tool["wipe"]
    assert denied.status_code == PbStatus.STATUS_CODE_ERROR and "never" in denied.status_message
    assert denied.attributes["error.type"] == "ToolDenied"
    assert denied.attributes["proctor.decision"] == "deny" and denied.attributes["proctor.rules"] == ["no-wipe"]
    assert denied.attributes["proctor.status"] == "denied"

    # An approved call: approval facts and the remaining budget.
    mail = by_tool["send_email"].attributes
    assert mail["proctor.decision"] == "require_approval" and mail["proctor.approval.outcome"] == "approve"
    assert mail["proctor.approval.approver"] == "alice" and mail["proctor.side_effect"] == "external"
    assert mail["proctor.budget.mail.calls_remaining"] == 2
    assert approvals[0].attributes["proctor.approval.outcome"] == "approve"

    # A failed call: ERROR with the tool's exception type.
    failed = by_tool["broken"]
    assert failed.status_code == PbStatus.STATUS_CODE_ERROR
    assert failed.attributes["error.type"] == "ValueError" and failed.attributes["proctor.status"] == "failed"

    # Metrics went through the same endpoint and protocol.
    assert {"proctor.decisions", "gen_ai.execute_tool.duration", "proctor.approval.wait",
            "proctor.budget.remaining", "gen_ai.invoke_agent.duration", "proctor.steps"} <= recv.metric_names
    decisions = next(m for m in recv.metrics if m.name == "proctor.decisions")
    total = sum(p.as_int for p in decisions.sum.data_points)
    assert total == 4
