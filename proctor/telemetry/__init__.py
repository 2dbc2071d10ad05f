"""Telemetry: OpenTelemetry spans and metrics for runs, steps and tool calls, and structlog logs.

The library depends only on the OpenTelemetry API and configures nothing on import:
without an SDK every span and metric is a no-op. The CLI (or an application) turns
export on with `proctor.telemetry.setup.configure_tracing`, and logs with
`proctor.telemetry.logging.configure_logging`. See docs/telemetry.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import proctor._lazy as _lazy

if TYPE_CHECKING:
    from proctor.telemetry.logging import bind_call, bind_run, configure_logging
    from proctor.telemetry.setup import configure_tracing
    from proctor.telemetry.spans import (
        AgentSpan,
        ApprovalSpan,
        StepSpan,
        ToolSpan,
        agent_span,
        approval_span,
        capture_content,
        current_context,
        get_tracer,
        set_capture_content,
        span_ids,
        step_span,
        tool_span,
    )

__all__ = [
    "AgentSpan",
    "ApprovalSpan",
    "StepSpan",
    "ToolSpan",
    "agent_span",
    "approval_span",
    "bind_call",
    "bind_run",
    "capture_content",
    "configure_logging",
    "configure_tracing",
    "current_context",
    "get_tracer",
    "set_capture_content",
    "span_ids",
    "step_span",
    "tool_span",
]

_lazy.install(__name__, {
    "bind_call": "proctor.telemetry.logging",
    "bind_run": "proctor.telemetry.logging",
    "configure_logging": "proctor.telemetry.logging",
    "configure_tracing": "proctor.telemetry.setup",
    "AgentSpan": "proctor.telemetry.spans",
    "ApprovalSpan": "proctor.telemetry.spans",
    "StepSpan": "proctor.telemetry.spans",
    "ToolSpan": "proctor.telemetry.spans",
    "agent_span": "proctor.telemetry.spans",
    "approval_span": "proctor.telemetry.spans",
    "capture_content": "proctor.telemetry.spans",
    "current_context": "proctor.telemetry.spans",
    "get_tracer": "proctor.telemetry.spans",
    "set_capture_content": "proctor.telemetry.spans",
    "span_ids": "proctor.telemetry.spans",
    "step_span": "proctor.telemetry.spans",
    "tool_span": "proctor.telemetry.spans",
})
