"""Calls made inside a sandboxed program (alias, map, lambda, comprehension, helper) each get a span under the step."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Status as PbStatus
from otlp_receivers import GrpcReceiver, HttpReceiver
from tel_helpers import make_gate

from proctor.interpreter import Interpreter
from proctor.telemetry import agent_span, setup, step_span
from proctor.telemetry import metrics as proctor_metrics

PROGRAM = """
look = lookup
a = look("A1")                                   # through an alias
b = list(map(lambda o: lookup(o), ["B1", "B2"]))  # map over a lambda
c = sorted(["C2", "C1"], key=lambda o: lookup(o))  # a sort key
d = [lookup(o) for o in ["D1"]]                  # a comprehension
def helper(o):
    return lookup(o)
e = helper("E1")                                 # a helper the model defined
try:
    wipe("db")
except ToolDenied as exc:
    f = str(exc)
print(a, b, c, d, e, f)
"""
# lookup: A1, B1, B2, C2, C1 (one call per element while sorting), D1, E1; then one denied wipe.
EXPECTED_LOOKUPS = 7


@pytest.fixture(params=["http/protobuf", "grpc"])
def receiver(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any]]:
    recv: Any = HttpReceiver() if request.param == "http/protobuf" else GrpcReceiver()
    try:
        yield request.param, recv
    finally:
        recv.close()
        proctor_metrics.use_meter_provider(None)


def test_program_calls_are_spans_under_their_step(receiver: tuple[str, Any]) -> None:
    """Every call a program makes, however it is reached, is one execute_tool span parented to the step."""
    protocol, recv = receiver
    provider = setup.configure_tracing(otlp_endpoint=recv.endpoint, protocol=protocol, set_global=False,
                                       metrics=False)
    assert provider is not None
    tracer = provider.get_tracer("proctor")
    gate = make_gate(tracer)
    ctx = gate.start_run()
    with Interpreter(tools=gate.tools.values(), gate=gate, timeout=30) as py, \
            agent_span(tracer, agent_name="coder", run=ctx.info) as run, \
            step_span(tracer, step=ctx.next_step(), parent=run) as step:
        result = py.run(PROGRAM, context=ctx, parent=step.context)
    assert result.error is None, result.error
    assert len(result.tool_calls) == EXPECTED_LOOKUPS + 1
    telemetry = setup.current()
    assert telemetry is not None and telemetry.shutdown(timeout_s=10)

    spans = recv.wait_for(lambda got: len(got) >= EXPECTED_LOOKUPS + 3)
    (step_got,) = [s for s in spans if s.name == "step 1"]
    tools = [s for s in spans if s.name.startswith("execute_tool ")]
    assert sorted(s.name for s in tools) == ["execute_tool lookup"] * EXPECTED_LOOKUPS + ["execute_tool wipe"]
    assert all(s.parent_id == step_got.span_id and s.trace_id == step_got.trace_id for s in tools)
    assert len({s.attributes["gen_ai.tool.call.id"] for s in tools}) == len(tools)
    assert {s.attributes["proctor.run.id"] for s in tools} == {ctx.info.id}
    (wipe,) = [s for s in tools if s.name == "execute_tool wipe"]
    assert wipe.status_code == PbStatus.STATUS_CODE_ERROR and wipe.attributes["error.type"] == "ToolDenied"
    # The records the interpreter returns point at the spans (ids in the audit trail match too).
    assert {r.call_id for r in result.tool_calls} == {s.attributes["gen_ai.tool.call.id"] for s in tools}
