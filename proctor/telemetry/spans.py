"""Spans for runs, steps, tool calls and approval waits, named as the GenAI conventions say.

    invoke_agent {agent}            agent_span()   INTERNAL, current while the run lasts
    └── step {n}                    step_span()    INTERNAL, current while the step lasts
        └── execute_tool {tool}     tool_span()    INTERNAL, one per call, parented explicitly
            └── approval {tool}     made by ToolSpan.approval() when a human was waited for

proctor depends only on the OpenTelemetry API: without an SDK these are no-op spans
and cost about 2 µs a call (not measurable in the gate bench). Tool spans are never made current — attaching a
context costs more than the rest of an allowed call — so the gate passes `parent`
(a `Context`, e.g. `step.context`) explicitly; that is also how calls made inside a
sandboxed program, which reach the gate on another thread, land under their step.
Run and step spans are made current, so logs and any instrumented library called
during them (an HTTP client, litellm) carry their ids.

Arguments and results go on spans only with content capture on (`set_capture_content`,
or OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true), and only as the gate
hands them over: already redacted by the policy, exactly as in the audit log.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import TracebackType
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode, Tracer

from proctor.calls import Decision, RunInfo
from proctor.telemetry import metrics
from proctor.telemetry import semconv as sc
from proctor.telemetry.base import (
    _REFUSED_APPROVALS,
    MAX_CONTENT_CHARS,
    _Handle,
    _set_error,
    capture_content,
    content_json,
    current_context,
    get_tracer,
    is_noop,
    record_exception,
    set_capture_content,
    span_ids,
)
from proctor.telemetry.runs import AgentSpan, StepSpan, agent_span, step_span
from proctor.textcaps import MAX_SPAN_TEXT, cap_attributes, cap_text

__all__ = [
    "AgentSpan",
    "ApprovalSpan",
    "QuietSpan",
    "StepSpan",
    "ToolSpan",
    "agent_span",
    "approval_span",
    "capture_content",
    "content_json",
    "current_context",
    "get_tracer",
    "is_noop",
    "set_capture_content",
    "span_ids",
    "step_span",
    "tool_span",
]

_ATTR_LIMIT = max(MAX_SPAN_TEXT, MAX_CONTENT_CHARS + 64)

# -- tool calls -------------------------------------------------------------------------------------


class ToolSpan(_Handle):
    """The `execute_tool {tool}` span of one call, with setters for what the gate learns.

    Attributes are gathered in a dict and handed to the span once, at `finish()`: the SDK
    validates each under a lock, and one batch is cheaper than four. Every setter is a
    no-op when the span is not recording; metrics are recorded either way.
    """

    __slots__ = ("_attrs", "_call_id", "_decision", "_finished", "_run_id", "_side_effect", "_started_ns", "_tool",
                 "_tracer")

    def __init__(self, span: Span, tracer: Tracer | None = None, tool: str = "", call_id: str = "",
                 run_id: str = "") -> None:
        super().__init__(span)
        self._tracer = tracer
        self._tool = tool
        self._call_id, self._run_id = call_id, run_id
        self._started_ns = time.perf_counter_ns()
        self._decision: str | None = None
        self._side_effect: str | None = None
        self._finished = False
        self._attrs: dict[str, Any] = {}

    def log_fields(self) -> dict[str, str]:
        """run_id, call_id, trace_id, span_id for a log event: ``log.error("…", **span.log_fields())``."""
        fields = {"run_id": self._run_id, "call_id": self._call_id}
        fields.update(super().log_fields())
        return fields

    def describe(self, description: str) -> None:
        """The tool's description (`gen_ai.tool.description`)."""
        if self.recording and description:
            self._attrs[sc.GEN_AI_TOOL_DESCRIPTION] = description

    def decision(self, decision: Decision, side_effect: str) -> None:
        """What the policy decided (called again after an approver edits the arguments)."""
        self._decision, self._side_effect = decision.outcome, side_effect
        if self.recording:
            attrs = self._attrs
            attrs[sc.PROCTOR_DECISION] = decision.outcome
            attrs[sc.PROCTOR_RULES] = list(decision.rules)
            attrs[sc.PROCTOR_REASON] = decision.reason
            attrs[sc.PROCTOR_SIDE_EFFECT] = side_effect
            attrs[sc.PROCTOR_POLICY_SHA256] = decision.policy_sha256

    def budget(self, remaining: Mapping[str, Mapping[str, Any]]) -> None:
        """What each budget has left once this call's reservation is made."""
        metrics.record_budget(remaining)
        if self.recording:
            attrs = self._attrs
            for name, limits in remaining.items():
                for kind, left in limits.items():
                    if isinstance(left, (int, float)) and not isinstance(left, bool):
                        attrs[f"{sc.PROCTOR_BUDGET_PREFIX}{name}.{kind}_remaining"] = left

    def approval(self, outcome: str, approver: str, wait_ns: int) -> None:
        """How the approval went; a wait for a human also becomes an `approval {tool}` child span."""
        if wait_ns > 0:
            metrics.record_approval(tool=self._tool, outcome=outcome, wait_s=wait_ns / 1e9)
        if not self.recording:
            return
        attrs: dict[str, str | int] = {
            sc.PROCTOR_APPROVAL_OUTCOME: outcome,
            sc.PROCTOR_APPROVAL_APPROVER: approver,
            sc.PROCTOR_APPROVAL_WAIT_MS: wait_ns // 1_000_000,
        }
        self._attrs.update(attrs)
        self.span.add_event(sc.APPROVAL_RESOLVED_EVENT, cap_attributes(attrs))
        if wait_ns > 0:
            # The gate reports the wait once it is over; the child span is drawn after the
            # fact with the true start and end, which is what a trace view shows anyway.
            end = time.time_ns()
            child = get_tracer(self._tracer).start_span(
                f"{sc.APPROVAL_SPAN} {self._tool}", context=self.context, kind=SpanKind.INTERNAL,
                attributes={sc.GEN_AI_TOOL_NAME: self._tool, **attrs}, start_time=end - wait_ns)
            if outcome in _REFUSED_APPROVALS:
                _set_error(child, outcome, f"approval {outcome} by {approver}")
            child.end(end_time=end)

    @property
    def capturing(self) -> bool:
        """Whether `arguments`/`result` would record anything: test it before redacting a result."""
        return self.recording and capture_content()

    def arguments(self, args: Mapping[str, Any]) -> None:
        """The call's arguments, redacted by the gate; recorded only with content capture on."""
        if self.recording and capture_content():
            self._attrs[sc.GEN_AI_TOOL_CALL_ARGUMENTS] = content_json(args)

    def result(self, value: Any, redact: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None) -> None:
        """The tool's result; recorded only with content capture on.

        `redact` is the policy's redaction (the gate passes it): applied to a mapping result,
        field by field as to arguments. A result it cannot handle is recorded as a placeholder,
        never an exception — the tool has already run.
        """
        if not (self.recording and capture_content()):
            return
        if redact is not None and isinstance(value, Mapping):
            try:
                value = redact(value)
            except Exception as exc:  # noqa: BLE001 - telemetry must not turn a done call into a failure
                value = f"[result not recorded: redaction failed: {type(exc).__name__}]"
        self._attrs[sc.GEN_AI_TOOL_CALL_RESULT] = content_json(value)

    def finish(self, status: str, error_type: str | None = None, message: str | None = None) -> None:
        """The call's end: `ok`, or `denied | failed | timeout` (status ERROR with `error.type`)."""
        if self._finished:
            return
        self._finished = True
        failed = status != "ok"
        if failed and not error_type:
            error_type = status
        if metrics.enabled():  # asked first: building the call's arguments costs more than the answer
            metrics.record_call(tool=self._tool, decision=self._decision, side_effect=self._side_effect,
                                status=status, error_type=error_type if failed else None,
                                duration_s=(time.perf_counter_ns() - self._started_ns) / 1e9)
        if self.recording:
            attrs = self._attrs
            attrs[sc.PROCTOR_STATUS] = status
            if failed:
                attrs[sc.ERROR_TYPE] = error_type
                self.span.set_status(Status(StatusCode.ERROR, None if message is None else cap_text(message)))
            self._flush()

    def _flush(self) -> None:
        if self._attrs:
            # Reason, rules… may quote a program's text; captured content is cut at MAX_CONTENT_CHARS already.
            self.span.set_attributes(cap_attributes(self._attrs, _ATTR_LIMIT))
            self._attrs = {}

    def end(self, exc: BaseException | None = None) -> None:
        """End the span (what `tool_span` does when its block exits): an exception `exc` that escaped a
        call not yet finished fails it; a span left unfinished still shows what was learnt."""
        if exc is not None and not self._finished:
            if self.recording:
                record_exception(self.span, exc)
            self.finish("failed", type(exc).__name__, str(exc))
        if self.span is INVALID_SPAN:  # no SDK: nothing was gathered, and ending it does nothing
            return
        self._flush()
        self.span.end()


class QuietSpan(ToolSpan):
    """A call's span while nothing would receive it (no OpenTelemetry SDK and no meter provider: both
    asked when the call starts): the gate's setters do nothing, metrics of approvals and budgets are
    still handed on (a provider set while the call waits for a human gets them), and it is its own
    context manager (``with QuietSpan(...) as span``).

    The gate's every call opens one. A `ToolSpan` with its context manager costs 14 attribute stores
    and four Python calls more: 3 µs of an allowed call's 32 µs in `gate.submit` (same process, 30,000
    calls, interleaved). A call already under way when metrics are switched on is not counted.
    """

    __slots__ = ()

    # The handle's fields, fixed: no span was started, so there is nothing to end or flush.
    span = INVALID_SPAN
    recording = False
    trace_id = None
    span_id = None
    capturing = False

    def __init__(self, tool: str, call_id: str, run_id: str) -> None:
        self._tool, self._call_id, self._run_id = tool, call_id, run_id
        self._finished = False

    def __enter__(self) -> QuietSpan:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None

    @property
    def context(self) -> Context:
        """A context holding the (invalid) span: children made under it start their own trace."""
        return trace.set_span_in_context(INVALID_SPAN)

    def log_fields(self) -> dict[str, str]:
        return {"run_id": self._run_id, "call_id": self._call_id}

    def describe(self, description: str) -> None:
        return None

    def decision(self, decision: Decision, side_effect: str) -> None:
        return None

    def arguments(self, args: Mapping[str, Any]) -> None:
        return None

    def result(self, value: Any, redact: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None) -> None:
        return None

    def event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        return None

    def finish(self, status: str, error_type: str | None = None, message: str | None = None) -> None:
        self._finished = True


class tool_span:  # lower case: used as a function; a class because @contextmanager costs ~1 µs
    """Open the `execute_tool {tool}` span (kind INTERNAL) of one call: ``with tool_span(...) as s:``.

    `parent` is a `Context` (None: the current one). The span is not made current.
    """

    __slots__ = ("_handle",)

    def __init__(self, tracer: Tracer, *, tool: str, call_id: str, run: RunInfo,
                 parent: Context | None = None) -> None:
        if is_noop(tracer):
            # No SDK: skip building attributes and the API's context lookups altogether.
            self._handle = ToolSpan(INVALID_SPAN, tracer, tool, call_id, run.id)
            return
        attributes: dict[str, Any] = {
            sc.GEN_AI_OPERATION_NAME: sc.EXECUTE_TOOL,
            sc.GEN_AI_TOOL_NAME: tool,
            sc.GEN_AI_TOOL_CALL_ID: call_id,
            sc.GEN_AI_TOOL_TYPE: sc.TOOL_TYPE_FUNCTION,
            sc.PROCTOR_RUN_ID: run.id,
            sc.PROCTOR_RUN_STEP: run.step,
        }
        if run.principal is not None:
            attributes[sc.PROCTOR_RUN_PRINCIPAL] = run.principal
        span = tracer.start_span(f"{sc.EXECUTE_TOOL} {tool}", context=parent, kind=SpanKind.INTERNAL,
                                 attributes=attributes)
        self._handle = ToolSpan(span, tracer, tool, call_id, run.id)

    def __enter__(self) -> ToolSpan:
        return self._handle

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._handle.end(exc)


# -- approval waits ---------------------------------------------------------------------------------


class ApprovalSpan(_Handle):
    """A live `approval {tool}` span, for code that waits for a human itself."""

    __slots__ = ("_resolved", "_started_ns", "_tool")

    def __init__(self, span: Span, tool: str) -> None:
        super().__init__(span)
        self._tool = tool
        self._started_ns = time.perf_counter_ns()
        self._resolved = False

    @property
    def resolved(self) -> bool:
        """Whether `resolve` was called (a wait that ended without an answer is resolved as an error)."""
        return self._resolved

    def resolve(self, outcome: str, approver: str) -> None:
        """The answer: `approve | grant | edit`, or `denied | timeout` (status ERROR)."""
        self._resolved = True
        wait_ns = time.perf_counter_ns() - self._started_ns
        metrics.record_approval(tool=self._tool, outcome=outcome, wait_s=wait_ns / 1e9)
        if self.recording:
            self.span.set_attributes({sc.PROCTOR_APPROVAL_OUTCOME: outcome, sc.PROCTOR_APPROVAL_APPROVER: approver,
                                      sc.PROCTOR_APPROVAL_WAIT_MS: wait_ns // 1_000_000})
            if outcome in _REFUSED_APPROVALS:
                _set_error(self.span, outcome, f"approval {outcome} by {approver}")


@contextmanager
def approval_span(tracer: Tracer | None, *, tool: str, call_id: str,
                  parent: Context | None = None) -> Iterator[ApprovalSpan]:
    """A live `approval {tool}` span around a wait for approval; call `.resolve()` with the answer."""
    span = get_tracer(tracer).start_span(
        f"{sc.APPROVAL_SPAN} {tool}", context=parent, kind=SpanKind.INTERNAL,
        attributes={sc.GEN_AI_TOOL_NAME: tool, sc.GEN_AI_TOOL_CALL_ID: call_id})
    handle = ApprovalSpan(span, tool)
    try:
        yield handle
    except BaseException as exc:
        if not handle.resolved:
            handle.resolve("denied", "error")
            span.set_attribute(sc.ERROR_TYPE, type(exc).__name__)
        raise
    finally:
        span.end()

