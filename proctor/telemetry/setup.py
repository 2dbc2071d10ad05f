"""Turn telemetry export on: an SDK tracer (and meter) provider with OTLP or console exporters.

Only the command line (or an application) calls this; importing proctor configures
nothing. Settings come from the arguments first, then the standard variables:

    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT   where to send
    OTEL_EXPORTER_OTLP_PROTOCOL (…_TRACES_PROTOCOL)   grpc | http/protobuf (default: http/protobuf
        for port 4318, grpc otherwise)
    OTEL_EXPORTER_OTLP_HEADERS, …_TIMEOUT, …_INSECURE, …_CERTIFICATE    read by the exporters
    OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES                          the resource
    OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG                         read by the SDK
    OTEL_TRACES_EXPORTER, OTEL_METRICS_EXPORTER   otlp | console | none (comma lists allowed)
    OTEL_BSP_MAX_QUEUE_SIZE, OTEL_BSP_SCHEDULE_DELAY, OTEL_METRIC_EXPORT_INTERVAL
    OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT   record redacted arguments/results

Spans go through a BatchSpanProcessor: ending a span appends to a bounded in-memory
queue (OTEL_BSP_MAX_QUEUE_SIZE, 2048) and a background thread exports; when the
collector is down or slow the queue fills and further spans are dropped, so a tool
call is never delayed by telemetry. `shutdown()` flushes with a bounded timeout, and
the SDK's own at-exit flush (unbounded against a hung collector) is replaced by ours.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlparse

from proctor.errors import ConfigurationError
from proctor.telemetry import metrics as proctor_metrics
from proctor.telemetry import spans

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.trace.sampling import Sampler

__all__ = ["OtlpProtocol", "Telemetry", "configure_tracing", "current", "resolve_endpoint", "shutdown"]

OtlpProtocol = Literal["grpc", "http/protobuf"]
_PROTOCOLS: tuple[str, ...] = ("grpc", "http/protobuf")
DEFAULT_SHUTDOWN_TIMEOUT_S = 5.0


@dataclass
class Telemetry:
    """The providers `configure_tracing` made; `shutdown()` flushes them within a deadline."""

    tracer_provider: TracerProvider | None = None
    meter_provider: MeterProvider | None = None
    endpoint: str | None = None
    protocol: str | None = None
    #: Spans the OTLP exporter delivered, and spans it failed to deliver (a collector down or refusing).
    exported: int = 0
    export_failed: int = 0
    _done: bool = field(default=False, repr=False)

    def shutdown(self, timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S) -> bool:
        """Flush and stop exporting; True if it finished within `timeout_s` (a hung collector cannot hold us)."""
        if self._done:
            return True
        self._done = True
        providers = [p for p in (self.tracer_provider, self.meter_provider) if p is not None]

        def run(provider: TracerProvider | MeterProvider) -> None:
            try:
                provider.shutdown()
            except Exception:  # noqa: BLE001 - shutting down must not raise into the CLI's exit path
                pass

        # The SDK's shutdown waits up to 30 s per processor and its exporters retry: run each
        # provider's on its own daemon thread (a hung span export must not starve the final
        # metric export) and give up on them after `timeout_s` in all.
        deadline = time.monotonic() + timeout_s
        threads = [threading.Thread(target=run, args=(p,), name="proctor-telemetry-shutdown", daemon=True)
                   for p in providers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in threads)


_current: Telemetry | None = None
_lock = threading.Lock()


def current() -> Telemetry | None:
    """The telemetry the last `configure_tracing` call set up, if any."""
    return _current


def shutdown(timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S) -> bool:
    """Flush and stop what `configure_tracing` set up, waiting at most `timeout_s` seconds."""
    telemetry = _current
    return telemetry.shutdown(timeout_s) if telemetry is not None else True


def _env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return None


def _exporters(variable: str) -> set[str]:
    value = _env(variable)
    return {v.strip().lower() for v in value.split(",") if v.strip()} if value else set()


def resolve_endpoint(endpoint: str | None, protocol: str | None) -> tuple[str, str, bool]:
    """(endpoint, protocol, per-signal) from the arguments and OTEL_* variables; raise ValueError if invalid.

    `per-signal` is True when the endpoint is a full traces URL (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
    that must be used as is rather than extended with ``/v1/traces``.
    """
    per_signal = False
    if endpoint is None:
        endpoint = _env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        per_signal = endpoint is not None
    if endpoint is None:
        endpoint = _env("OTEL_EXPORTER_OTLP_ENDPOINT")
    proto = (protocol or _env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL") or "").lower()
    if endpoint is None:
        endpoint = "http://localhost:4318" if proto == "http/protobuf" else "http://localhost:4317"
    if "://" not in endpoint:
        endpoint = "http://" + endpoint  # "localhost:4317" would otherwise be taken as a TLS target
    parsed = urlparse(endpoint)
    if not parsed.hostname:
        raise ConfigurationError(f"invalid OTLP endpoint {endpoint!r}: expected a URL like http://localhost:4317")
    if not proto:
        proto = "http/protobuf" if parsed.port == 4318 else "grpc"
    if proto not in _PROTOCOLS:
        raise ConfigurationError(f"unsupported OTLP protocol {proto!r}: use grpc or http/protobuf")
    return endpoint, proto, per_signal


def _http_url(endpoint: str, path: str, per_signal: bool) -> str:
    if per_signal or endpoint.rstrip("/").endswith(path):
        return endpoint
    return endpoint.rstrip("/") + path


def _counted(inner: SpanExporter, telemetry: Telemetry) -> SpanExporter:
    """`inner`, counting on `telemetry` the spans it delivered and those it failed to deliver,
    so nothing claims an export that failed. (Built here: the SDK is imported only when used.)"""
    from opentelemetry.sdk.trace.export import SpanExporter as Base
    from opentelemetry.sdk.trace.export import SpanExportResult

    class Counted(Base):
        def export(self, batch: Sequence[ReadableSpan]) -> SpanExportResult:
            try:
                result = inner.export(batch)
            except Exception:
                telemetry.export_failed += len(batch)
                raise
            if result == SpanExportResult.SUCCESS:
                telemetry.exported += len(batch)
            else:
                telemetry.export_failed += len(batch)
            return result

        def shutdown(self) -> None:
            inner.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return inner.force_flush(timeout_millis)

    return Counted()


def _span_exporter(endpoint: str, protocol: str, per_signal: bool,
                   headers: dict[str, str] | None, timeout_s: float | None) -> SpanExporter:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter

        return GrpcSpanExporter(endpoint=endpoint, headers=headers, timeout=timeout_s)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter

    return HttpSpanExporter(endpoint=_http_url(endpoint, "/v1/traces", per_signal), headers=headers,
                            timeout=timeout_s)


def _metric_exporter(endpoint: str, protocol: str, headers: dict[str, str] | None,
                     timeout_s: float | None) -> MetricExporter:
    metrics_endpoint = _env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter

        return GrpcMetricExporter(endpoint=metrics_endpoint or endpoint, headers=headers, timeout=timeout_s)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter

    url = metrics_endpoint or _http_url(endpoint, "/v1/metrics", False)
    return HttpMetricExporter(endpoint=url, headers=headers, timeout=timeout_s)


def _one_line(span: ReadableSpan) -> str:
    """A compact console line per span: enough to follow a run without a collector."""
    ctx = span.get_span_context()
    parent = format(span.parent.span_id, "016x") if span.parent else "-"
    ms = ((span.end_time or 0) - (span.start_time or 0)) / 1e6
    attrs = span.attributes or {}
    labels = {"proctor.decision": "decision", "proctor.status": "status", "error.type": "error",
              "proctor.approval.outcome": "approval"}
    if attrs.get("gen_ai.operation.name") == "invoke_agent":
        labels["proctor.run.id"] = "run"
    extra = " ".join(f"{label}={attrs[key]!s}" for key, label in labels.items() if key in attrs)
    status = span.status.status_code.name
    return (f"[span] {span.name} {ms:.3f}ms {status} trace={format(ctx.trace_id, '032x') if ctx else '-'} "
            f"span={format(ctx.span_id, '016x') if ctx else '-'} parent={parent} {extra}".rstrip() + "\n")


def _resource(service_name: str | None) -> Resource:
    from opentelemetry.sdk.resources import Resource

    attributes: dict[str, str] = {"service.version": _version()}
    # One id per process, so Prometheus keeps each run's cumulative counters apart (`instance`).
    if "service.instance.id" not in (_env("OTEL_RESOURCE_ATTRIBUTES") or ""):
        attributes["service.instance.id"] = str(uuid.uuid4())
    # Resource.create reads OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES; an explicit name wins.
    if service_name is not None:
        attributes["service.name"] = service_name
    elif not _env("OTEL_SERVICE_NAME"):
        attributes["service.name"] = "proctor"
    return Resource.create(attributes)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("proctor")
    except Exception:  # noqa: BLE001 - not installed as a distribution (a source checkout)
        return "0+unknown"


def configure_tracing(
    *,
    otlp_endpoint: str | None = None,
    protocol: str | None = None,
    console: bool = False,
    service_name: str | None = None,
    metrics: bool | None = None,
    capture_content: bool | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float | None = None,
    sampler: Sampler | None = None,
    set_global: bool = True,
) -> TracerProvider | None:
    """Configure span (and metric) export; return the tracer provider, or None when nothing is enabled.

    Export is on when `otlp_endpoint` or an OTLP endpoint variable is set (or
    OTEL_TRACES_EXPORTER names otlp), and console output when `console` is true.
    `metrics` (default: on whenever OTLP is on, unless OTEL_METRICS_EXPORTER=none) sends
    the `proctor.telemetry.metrics` instruments through the same endpoint and protocol.
    With `set_global` (the CLI) the providers become the process-wide ones, so the gate
    and agent's default tracers use them; tests pass False and use the returned provider.
    Raises ValueError, one line, on an invalid endpoint or protocol.
    """
    global _current
    traces_exporters = _exporters("OTEL_TRACES_EXPORTER")
    if "none" in traces_exporters and otlp_endpoint is None and not console:
        return None
    want_otlp = otlp_endpoint is not None or "otlp" in traces_exporters or (
        not traces_exporters and _env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT") is not None)
    want_console = console or "console" in traces_exporters
    if capture_content is not None:
        spans.set_capture_content(capture_content)
    if not want_otlp and not want_console:
        return None

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor

    resource = _resource(service_name)
    # shutdown_on_exit=False: the SDK's at-exit shutdown can block 30 s+ on a hung collector.
    provider = TracerProvider(resource=resource, sampler=sampler, shutdown_on_exit=False)
    telemetry = Telemetry(tracer_provider=provider)
    if want_otlp:
        endpoint, proto, per_signal = resolve_endpoint(otlp_endpoint, protocol)
        telemetry.endpoint, telemetry.protocol = endpoint, proto
        exporter = _counted(_span_exporter(endpoint, proto, per_signal, headers, timeout_s), telemetry)
        provider.add_span_processor(BatchSpanProcessor(exporter))
        metrics_exporters = _exporters("OTEL_METRICS_EXPORTER")
        if metrics is None:
            metrics = "none" not in metrics_exporters
        if metrics:
            telemetry.meter_provider = _meter_provider(resource, _metric_exporter(endpoint, proto, headers, timeout_s))
    if want_console:
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr, formatter=_one_line)))

    if set_global:
        trace.set_tracer_provider(provider)
        if telemetry.meter_provider is not None:
            from opentelemetry import metrics as otel_metrics

            otel_metrics.set_meter_provider(telemetry.meter_provider)
    elif telemetry.meter_provider is not None:
        proctor_metrics.use_meter_provider(telemetry.meter_provider)
    with _lock:
        first = _current is None
        _current = telemetry
    if first:
        atexit.register(shutdown)
    return provider


def _meter_provider(resource: Resource, exporter: MetricExporter) -> MeterProvider:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    reader = PeriodicExportingMetricReader(exporter)  # interval: OTEL_METRIC_EXPORT_INTERVAL (60 s)
    return MeterProvider(resource=resource, metric_readers=[reader], shutdown_on_exit=False)
