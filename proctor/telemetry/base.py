"""What every proctor span handle shares: the tracer, content capture, ids, a context for children.

Kept apart from `spans` (tool calls) and `runs` (runs and steps) so both can use it
without importing each other.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import INVALID_SPAN, NoOpTracer, ProxyTracer, Span, Status, StatusCode, Tracer

from proctor.telemetry import semconv as sc
from proctor.textcaps import MAX_SPAN_TEXT, cap_attributes, cap_text

__all__ = [
    "MAX_CONTENT_CHARS",
    "capture_content",
    "content_json",
    "current_context",
    "get_tracer",
    "is_noop",
    "set_capture_content",
    "span_ids",
]

_TRACER_NAME = "proctor"
#: Captured content longer than this is cut (spans are not a data store).
MAX_CONTENT_CHARS = 8192
_CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_capture = os.environ.get(_CAPTURE_ENV, "").strip().lower() in ("1", "true", "yes", "on")
_OK_STATUSES = frozenset({"ok", "done", "final_answer"})
_REFUSED_APPROVALS = frozenset({"denied", "timeout", "deny"})


def set_capture_content(enabled: bool) -> None:
    """Record (redacted) tool arguments, results and step code on spans; off by default."""
    global _capture
    _capture = bool(enabled)


def capture_content() -> bool:
    """Whether content capture is on."""
    return _capture


def _plain(value: Any) -> Any:
    """What JSON cannot hold: an image as its description (digest, bytes, size, format), anything else its repr."""
    from proctor.images import is_image

    if is_image(value):
        from proctor.errors import ImageError
        from proctor.images import load_image

        try:
            return {"image": load_image(value).describe()}
        except ImageError as exc:
            return f"[image not described: {exc}]"
    return repr(value)


def content_json(value: Any) -> str:
    """`value` as compact JSON (repr for what JSON cannot hold), cut at MAX_CONTENT_CHARS."""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True, default=_plain)
        except (TypeError, ValueError):
            text = repr(value)
    if len(text) > MAX_CONTENT_CHARS:
        text = text[:MAX_CONTENT_CHARS] + f"…[{len(text) - MAX_CONTENT_CHARS} more chars]"
    return text


_MISSING = object()


def is_noop(tracer: Tracer) -> bool:
    """Whether `tracer` can only make no-op spans (no SDK configured); cheap enough for every call.

    A ProxyTracer forwards to the global provider's tracer once `_TRACER_PROVIDER` is set
    and to a no-op tracer before; the public `get_tracer_provider()` would cost a lookup in
    os.environ per call, so read the same global the proxy reads (should it ever vanish,
    the answer is "not no-op" and the normal path runs).
    """
    kind = type(tracer)
    if kind is ProxyTracer:
        return getattr(trace, "_TRACER_PROVIDER", _MISSING) is None
    return kind is NoOpTracer


def get_tracer(tracer: Tracer | None = None) -> Tracer:
    """`tracer`, or proctor's tracer from the global provider (a no-op until one is set)."""
    return tracer if tracer is not None else trace.get_tracer(_TRACER_NAME)


def span_ids(span: Span) -> tuple[str | None, str | None]:
    """(trace id, span id) as hex, or (None, None) for a span that is not recording."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None, None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


def current_context() -> Context:
    """The current OpenTelemetry context: pass it as `parent=` to carry it to another thread."""
    return otel_context.get_current()


def _set_error(span: Span, error_type: str | None, message: str | None) -> None:
    span.set_attribute(sc.ERROR_TYPE, cap_text(error_type or sc.ERROR_OTHER))
    span.set_status(Status(StatusCode.ERROR, None if message is None else cap_text(message)))


def record_exception(span: Span, exc: BaseException) -> None:
    """`span.record_exception(exc)` with its message and stack trace capped (`proctor.textcaps`)."""
    import traceback

    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    span.record_exception(exc, attributes={"exception.message": cap_text(str(exc)),
                                           "exception.stacktrace": cap_text(trace, 4 * MAX_SPAN_TEXT)})


class _Handle:
    """What every span handle offers: the span, its ids, and a context to parent children."""

    __slots__ = ("_context", "recording", "span", "span_id", "trace_id")

    def __init__(self, span: Span) -> None:
        self.span = span
        self._context: Context | None = None
        if span is INVALID_SPAN:
            self.recording, self.trace_id, self.span_id = False, None, None
            return
        self.recording = span.is_recording()
        self.trace_id, self.span_id = span_ids(span)

    @property
    def context(self) -> Context:
        """A context holding this span, to pass as `parent=` (e.g. to `gate.submit`)."""
        if self._context is None:
            self._context = trace.set_span_in_context(self.span)
        return self._context

    def event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        """Add a span event (Jaeger's "Logs", Phoenix's "Events"): a refusal, an approval, a budget stop."""
        if self.recording:
            self.span.add_event(name, cap_attributes(attributes))

    def log_fields(self) -> dict[str, str]:
        """trace_id / span_id for a log event, so a log line leads to its span."""
        return {"trace_id": self.trace_id, "span_id": self.span_id} if self.trace_id and self.span_id else {}
