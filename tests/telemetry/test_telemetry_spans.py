"""Span handles: attributes, statuses, content capture, approval child spans and the no-SDK path."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode
from tel_helpers import make_gate

from proctor.calls import Decision, RunInfo
from proctor.errors import ApprovalDenied
from proctor.telemetry import (
    agent_span,
    approval_span,
    current_context,
    set_capture_content,
    step_span,
    tool_span,
)
from proctor.telemetry.base import MAX_CONTENT_CHARS, content_json
from proctor.telemetry.runs import provider_from_model
from proctor.testing import SpanCapture


@pytest.fixture
def capture() -> SpanCapture:
    return SpanCapture()


@pytest.fixture
def content_on() -> Iterator[None]:
    set_capture_content(True)
    yield
    set_capture_content(False)


def test_tool_span_names_and_attributes(capture: SpanCapture) -> None:
    """execute_tool {tool} is INTERNAL and carries the GenAI and proctor attributes the gate sets."""
    run = RunInfo(id="run_1", step=3, principal="bob")
    with tool_span(capture.tracer, tool="lookup", call_id="call_1", run=run) as span:
        span.describe("Look an order up.")
        span.decision(Decision("allow", ("reads",), "reads are fine", "ab" * 32), "read")
        span.budget({"run-calls": {"calls": 49, "cost": 10.5, "wall_time": None}})
        span.finish("ok")
    (s,) = capture.spans()
    assert s.name == "execute_tool lookup" and s.kind is SpanKind.INTERNAL
    a = dict(s.attributes or {})
    assert a["gen_ai.operation.name"] == "execute_tool" and a["gen_ai.tool.name"] == "lookup"
    assert a["gen_ai.tool.call.id"] == "call_1" and a["gen_ai.tool.type"] == "function"
    assert a["gen_ai.tool.description"] == "Look an order up."
    assert a["proctor.run.id"] == "run_1" and a["proctor.run.step"] == 3 and a["proctor.run.principal"] == "bob"
    assert a["proctor.decision"] == "allow" and a["proctor.rules"] == ("reads",)
    assert a["proctor.budget.run-calls.calls_remaining"] == 49
    assert a["proctor.budget.run-calls.cost_remaining"] == 10.5
    assert "proctor.budget.run-calls.wall_time_remaining" not in a
    assert s.status.status_code is StatusCode.UNSET and "error.type" not in a


def test_refused_and_failed_calls_are_errors(capture: SpanCapture) -> None:
    """Denied, failed and timed-out calls get status ERROR and an error.type (the status when none is given)."""
    run = RunInfo()
    for status, error_type in (("denied", "BudgetExceeded"), ("failed", "KeyError"), ("timeout", None)):
        with tool_span(capture.tracer, tool="t", call_id=status, run=run) as span:
            span.finish(status, error_type, f"{status}!")
            span.finish("ok")  # a second finish is ignored
    got = {s.attributes["gen_ai.tool.call.id"]: s for s in capture.spans() if s.attributes}
    assert got["denied"].attributes is not None and got["denied"].attributes["error.type"] == "BudgetExceeded"
    assert got["failed"].attributes is not None and got["failed"].attributes["error.type"] == "KeyError"
    assert got["timeout"].attributes is not None and got["timeout"].attributes["error.type"] == "timeout"
    assert all(s.status.status_code is StatusCode.ERROR for s in got.values())
    assert got["denied"].status.description == "denied!"


def test_exception_escaping_the_span_marks_it_failed(capture: SpanCapture) -> None:
    """An exception that escapes an unfinished tool span ends it as failed with the exception's type."""
    with pytest.raises(KeyboardInterrupt), tool_span(capture.tracer, tool="t", call_id="c", run=RunInfo()):
        raise KeyboardInterrupt
    (s,) = capture.spans()
    assert s.status.status_code is StatusCode.ERROR and s.attributes is not None
    assert s.attributes["error.type"] == "KeyboardInterrupt" and s.attributes["proctor.status"] == "failed"
    assert [e.name for e in s.events] == ["exception"]


def test_approval_wait_becomes_a_child_span(capture: SpanCapture) -> None:
    """A wait for a human is drawn as `approval {tool}` under the call, lasting as long as the wait."""
    with tool_span(capture.tracer, tool="send_email", call_id="c", run=RunInfo()) as span:
        span.approval("denied", "carol", 250_000_000)
        span.finish("denied", "ApprovalDenied", "no")
    child, parent = capture.spans()
    assert child.name == "approval send_email" and child.parent is not None
    assert child.parent.span_id == parent.context.span_id
    assert child.end_time is not None and child.start_time is not None
    assert child.end_time - child.start_time == 250_000_000
    assert child.status.status_code is StatusCode.ERROR and child.attributes is not None
    assert child.attributes["error.type"] == "denied" and child.attributes["proctor.approval.approver"] == "carol"
    assert parent.attributes is not None and parent.attributes["proctor.approval.wait_ms"] == 250


def test_grant_has_no_wait_span(capture: SpanCapture) -> None:
    """A call approved by an earlier grant waited for nobody: attributes only, no child span."""
    with tool_span(capture.tracer, tool="t", call_id="c", run=RunInfo()) as span:
        span.approval("granted", "grant", 0)
        span.finish("ok")
    (s,) = capture.spans()
    assert s.attributes is not None and s.attributes["proctor.approval.outcome"] == "granted"


def test_live_approval_span(capture: SpanCapture) -> None:
    """approval_span() times a wait as it happens and records the answer."""
    with tool_span(capture.tracer, tool="t", call_id="c", run=RunInfo()) as call, approval_span(
        capture.tracer, tool="t", call_id="c", parent=call.context
    ) as wait:
        wait.resolve("approve", "dave")
    wait_span = capture.spans("approval")[0]
    assert wait_span.attributes is not None and wait_span.attributes["proctor.approval.outcome"] == "approve"
    assert wait_span.status.status_code is StatusCode.UNSET


def test_content_is_off_by_default(capture: SpanCapture) -> None:
    """Arguments and results stay off spans unless content capture is turned on."""
    with tool_span(capture.tracer, tool="t", call_id="c", run=RunInfo()) as span:
        span.arguments({"card": "4111"})
        span.result("secret")
        span.finish("ok")
    attrs = capture.spans()[0].attributes or {}
    assert "gen_ai.tool.call.arguments" not in attrs and "gen_ai.tool.call.result" not in attrs


def test_content_when_enabled(capture: SpanCapture, content_on: None) -> None:
    """With capture on, (already redacted) arguments and results are recorded as JSON, cut when huge."""
    with tool_span(capture.tracer, tool="t", call_id="c", run=RunInfo()) as span:
        span.arguments({"to": "x@y", "body": {"$redacted": "hmac-sha256:00"}})
        span.result({"n": 1, "blob": "z" * (MAX_CONTENT_CHARS + 10)})
        span.finish("ok")
    attrs = capture.spans()[0].attributes or {}
    assert attrs["gen_ai.tool.call.arguments"] == '{"body":{"$redacted":"hmac-sha256:00"},"to":"x@y"}'
    result = attrs["gen_ai.tool.call.result"]
    assert isinstance(result, str) and result.endswith("more chars]") and len(result) < MAX_CONTENT_CHARS + 40
    assert content_json({1, 2}) == "\"{1, 2}\""  # not JSON-able: its repr, never an exception


def test_agent_and_step_spans_nest_and_are_current(capture: SpanCapture) -> None:
    """invoke_agent and step spans are current while open, nest, sum usage and pass their context to tool spans."""
    run = RunInfo(id="run_9", principal="p")
    with agent_span(capture.tracer, agent_name="ops", run=run, model="gpt-4o") as agent:
        assert trace.get_current_span() is agent.span
        with step_span(capture.tracer, step=1, parent=agent) as step:
            assert trace.get_current_span() is step.span
            step.usage(input_tokens=10, output_tokens=2)
            step.code("print(1)")  # capture off: not recorded
            ctx = current_context()
        with step_span(capture.tracer, step=2, parent=agent) as step2:
            step2.usage(input_tokens=5, output_tokens=1)
            with tool_span(capture.tracer, tool="t", call_id="c", run=run, parent=ctx) as call:
                call.finish("ok")
    assert trace.get_current_span() is trace.INVALID_SPAN
    spans = {s.name: s for s in capture.spans()}
    root = spans["invoke_agent ops"]
    assert root.attributes is not None and root.attributes["gen_ai.provider.name"] == "openai"
    assert root.attributes["gen_ai.usage.input_tokens"] == 15 and root.attributes["gen_ai.usage.output_tokens"] == 3
    assert root.attributes["proctor.agent.status"] == "done"
    assert spans["step 1"].parent is not None and spans["step 1"].parent.span_id == root.context.span_id
    assert spans["step 1"].attributes is not None and "proctor.step.code" not in spans["step 1"].attributes
    assert spans["step 1"].attributes["gen_ai.agent.name"] == "ops"
    # The tool span used the context captured inside step 1, though step 2 was current.
    assert spans["execute_tool t"].parent is not None
    assert spans["execute_tool t"].parent.span_id == spans["step 1"].context.span_id


def test_agent_span_records_failure(capture: SpanCapture, content_on: None) -> None:
    """An exception escaping a run marks the run and its step as errors; finish() statuses other than done too."""
    with pytest.raises(RuntimeError), agent_span(capture.tracer, agent_name="a", run=RunInfo()) as agent, \
            step_span(capture.tracer, step=1, parent=agent) as step:
        step.code("boom()")
        raise RuntimeError("model unreachable")
    with agent_span(capture.tracer, agent_name="b", run=RunInfo()) as agent:
        agent.finish("max_steps", message="gave up after 10 steps")
    spans = {s.name: s for s in capture.spans()}
    for name in ("invoke_agent a", "step 1"):
        assert spans[name].status.status_code is StatusCode.ERROR
        assert spans[name].attributes is not None and spans[name].attributes["error.type"] == "RuntimeError"
    assert spans["step 1"].attributes is not None and spans["step 1"].attributes["proctor.step.code"] == "boom()"
    b = spans["invoke_agent b"]
    assert b.status.status_code is StatusCode.ERROR and b.attributes is not None
    assert b.attributes["error.type"] == "max_steps"


def test_gate_denial_through_span_capture(capture: SpanCapture) -> None:
    """Through the real gate, an approval denied by a human is an ERROR span with its wait as a child."""
    gate = make_gate(capture.tracer, approve=False)
    outcome = gate.submit("send_email", {"to": "x@else.org", "body": "hi"})
    assert isinstance(outcome.error, ApprovalDenied)
    call = capture.spans("execute_tool")[0]
    assert call.status.status_code is StatusCode.ERROR and call.attributes is not None
    assert call.attributes["error.type"] == "ApprovalDenied"
    assert call.attributes["proctor.approval.outcome"] == "denied"
    assert outcome.record.call_id == call.attributes["gen_ai.tool.call.id"]


def test_no_sdk_means_no_op_spans() -> None:
    """Without an SDK the handles are non-recording and every setter is harmless."""
    noop = trace.NoOpTracer()  # what the global proxy hands out while no SDK is installed
    with agent_span(noop, agent_name="a", run=RunInfo()) as agent, step_span(noop, step=1, parent=agent) as step, \
            tool_span(noop, tool="t", call_id="c", run=RunInfo(id="r"), parent=step.context) as span:
        span.decision(Decision("deny", (), "no", ""), "read")
        span.approval("denied", "x", 5)
        span.finish("denied", "ToolDenied", "no")
    assert not span.recording and span.trace_id is None and span.span is trace.INVALID_SPAN  # the fast path
    assert span.log_fields() == {"run_id": "r", "call_id": "c"}


@pytest.mark.parametrize(("model", "provider"), [
    ("ollama_chat/qwen2.5-coder:7b", "ollama"), ("anthropic/claude-3", "anthropic"), ("bedrock/x", "aws.bedrock"),
    ("claude-3-5", "anthropic"), ("my/own", "my"), ("scripted", "unknown"), (None, "unknown"),
])
def test_provider_from_model(model: str | None, provider: str) -> None:
    """gen_ai.provider.name follows the litellm prefix, mapped to the conventions' well-known values."""
    assert provider_from_model(model) == provider


@pytest.mark.process
def test_noop_detection_follows_the_global_provider() -> None:
    """The no-SDK fast path holds exactly until a global provider is installed (checked in a fresh process)."""
    program = (
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from proctor.telemetry import get_tracer\n"
        "from proctor.telemetry import metrics as m\n"
        "from proctor.telemetry.spans import is_noop\n"
        "tracer = get_tracer()\n"
        "before = (is_noop(tracer), m.enabled())\n"
        "trace.set_tracer_provider(TracerProvider(shutdown_on_exit=False))\n"
        "from opentelemetry import metrics\n"
        "from opentelemetry.sdk.metrics import MeterProvider\n"
        "metrics.set_meter_provider(MeterProvider(shutdown_on_exit=False))\n"
        "print(before, (is_noop(tracer), m.enabled()))\n"
    )
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "(True, False) (False, True)"
