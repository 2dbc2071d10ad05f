"""Test doubles for code that uses proctor: a scripted model, an in-memory audit sink, a span capture.

Import them in your own tests::

    from proctor.testing import InMemoryAudit, SpanCapture

    audit = InMemoryAudit()
    gate = Gate(policy, audit=audit)
    ...
    assert audit.kinds() == ["run_started", "call_intent", "call_outcome"]
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from proctor.agent.models import ModelResponse, ScriptedModel
from proctor.audit.base import KINDS, AuditResult, derive_key
from proctor.calls import new_id
from proctor.redaction import Redacted, redact_args

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.trace import Tracer

__all__ = ["InMemoryAudit", "ModelResponse", "ScriptedModel", "SpanCapture"]


class InMemoryAudit:
    """An `AuditSink` that keeps records in a list.

    Set `fail_on` to record kinds (e.g. ``{"call_intent"}``) to make those appends
    fail, as a full disk would, and check that the caller refuses to go on.
    """

    def __init__(self, *, fail_on: Sequence[str] = ()) -> None:
        self.records: list[dict[str, Any]] = []
        self.fail_on = set(fail_on)
        self.closed = False
        self._key = new_id().encode()
        self._lock = threading.Lock()

    def append(self, kind: str, fields: Mapping[str, Any], *, durable: bool = True) -> AuditResult:
        with self._lock:
            if self.closed:
                return AuditResult(ok=False, error="the audit sink is closed")
            if kind in self.fail_on:
                return AuditResult(ok=False, error=f"simulated failure writing {kind}")
            if kind not in KINDS:  # as the real sinks refuse it
                return AuditResult(ok=False, error=f"kind {kind!r} cannot be appended (allowed: {', '.join(KINDS)})")
            seq = len(self.records)
            self.records.append({"seq": seq, "kind": kind, "durable": durable, **fields})
            return AuditResult(ok=True, seq=seq)

    def key_for(self, purpose: str) -> bytes:
        """This sink's secret derived for `purpose` (`AuditSink.key_for`)."""
        return derive_key(self._key, purpose)

    def run_records(self, run_id: str) -> list[dict[str, Any]]:
        """The records of run `run_id`, in order (`AuditReader`)."""
        with self._lock:
            return [dict(r) for r in self.records if r.get("run_id") == run_id]

    def redact(self, args: Mapping[str, Any], fields: Sequence[str]) -> Redacted:
        return redact_args(args, fields, self._key)

    def close(self) -> None:
        self.closed = True

    def kinds(self) -> list[str]:
        """The kinds of the records, in order."""
        return [r["kind"] for r in self.records]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        """The records of one kind, in order."""
        return [r for r in self.records if r["kind"] == kind]


class SpanCapture:
    """An OpenTelemetry SDK tracer provider that keeps finished spans in memory.

    Needs the ``otel`` extra (opentelemetry-sdk). Pass `capture.tracer` to a Gate or
    an agent; read `capture.spans()` after.
    """

    def __init__(self) -> None:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        self.exporter = InMemorySpanExporter()
        self.provider: TracerProvider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer: Tracer = self.provider.get_tracer("proctor")

    def spans(self, name_prefix: str = "") -> list[ReadableSpan]:
        """Finished spans, oldest first, optionally only those whose name starts with `name_prefix`."""
        return [s for s in self.exporter.get_finished_spans() if s.name.startswith(name_prefix)]

    def __iter__(self) -> Iterator[ReadableSpan]:
        return iter(self.spans())

    def clear(self) -> None:
        self.exporter.clear()
