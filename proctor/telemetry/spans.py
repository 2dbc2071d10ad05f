"""Spans for runs, steps and tool calls, named as the OpenTelemetry GenAI conventions say.

proctor depends only on the OpenTelemetry API: without an SDK configured these are
no-op spans that cost almost nothing. The CLI configures the SDK (see `setup`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from proctor.calls import Decision, RunInfo

__all__ = ["ToolSpan", "get_tracer", "span_ids", "tool_span"]

_TRACER_NAME = "proctor"


def get_tracer(tracer: Tracer | None = None) -> Tracer:
    """`tracer`, or proctor's tracer from the global provider (a no-op until one is set)."""
    return tracer if tracer is not None else trace.get_tracer(_TRACER_NAME)


def span_ids(span: Span) -> tuple[str | None, str | None]:
    """(trace id, span id) as hex, or (None, None) for a span that is not recording."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None, None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


class ToolSpan:
    """The `execute_tool {tool}` span of one call, with setters for what the gate learns."""

    def __init__(self, span: Span) -> None:
        self.span = span
        self.trace_id, self.span_id = span_ids(span)

    def decision(self, decision: Decision, side_effect: str) -> None:
        self.span.set_attributes(
            {
                "proctor.decision": decision.outcome,
                "proctor.rules": list(decision.rules),
                "proctor.reason": decision.reason,
                "proctor.side_effect": side_effect,
                "proctor.policy.sha256": decision.policy_sha256,
            }
        )

    def budget(self, remaining: Mapping[str, Mapping[str, Any]]) -> None:
        for name, limits in remaining.items():
            for kind, left in limits.items():
                if isinstance(left, (int, float)):
                    self.span.set_attribute(f"proctor.budget.{name}.{kind}_remaining", left)

    def approval(self, outcome: str, approver: str, wait_ns: int) -> None:
        self.span.set_attributes(
            {
                "proctor.approval.outcome": outcome,
                "proctor.approval.approver": approver,
                "proctor.approval.wait_ms": wait_ns // 1_000_000,
            }
        )

    def finish(self, status: str, error_type: str | None = None, message: str | None = None) -> None:
        self.span.set_attribute("proctor.status", status)
        if status != "ok":
            self.span.set_attribute("error.type", error_type or status)
            self.span.set_status(Status(StatusCode.ERROR, message))


@contextmanager
def tool_span(
    tracer: Tracer, *, tool: str, call_id: str, run: RunInfo, parent: Context | None = None
) -> Iterator[ToolSpan]:
    """Open the `execute_tool {tool}` span (kind INTERNAL) of one call.

    The span is not made current: attaching a context costs more than the rest of
    an allowed call, and the gate passes parents explicitly.
    """
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "gen_ai.tool.call.id": call_id,
        "gen_ai.tool.type": "function",
        "proctor.run.id": run.id,
        "proctor.run.step": run.step,
    }
    span = tracer.start_span(f"execute_tool {tool}", context=parent, kind=SpanKind.INTERNAL, attributes=attributes)
    try:
        yield ToolSpan(span)
    finally:
        span.end()
