"""Tracing overhead per tool call: `gate.call` of an allowed read-only tool under several telemetry set-ups.

Run by hand: ``.venv/bin/python bench/telemetry.py [--calls 20000] [--rounds 3]``.

Set-ups, each with its own gate (no global provider is installed, so "no SDK" is honest):

- none          telemetry cut out of the gate entirely (a stub span): the floor
- no-sdk        the OpenTelemetry API only: no-op spans and metrics (what a library user gets)
- sampled-drop  SDK, sampled on, BatchSpanProcessor into an exporter that drops every batch
- sampled-otlp  SDK, sampled on, BatchSpanProcessor into the real OTLP/HTTP exporter aimed at a closed
                port (a collector that is down: the queue fills, spans are dropped)
- sampled+metrics  sampled-drop plus an SDK MeterProvider recording proctor's metrics
- sampler-off   SDK with the ALWAYS_OFF sampler: spans are created but not recorded

Prints p50 / p99 / mean per call in microseconds, side by side; the difference from
`none` is what telemetry costs a call. Rounds of all set-ups are interleaved, so a
burst of load on a shared machine hits them alike; the best round of each is kept.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON
from opentelemetry.trace import Tracer

from proctor import gate as gate_module
from proctor.gate import Gate
from proctor.policy import Policy
from proctor.telemetry import metrics as proctor_metrics
from proctor.tools import tool

POLICY: dict[str, Any] = {
    "version": 1,
    "default": "deny",
    "budgets": [{"name": "run-calls", "limit": {"calls": 10_000_000}}],
    "rules": [{"name": "reads", "match": {"side_effect": ["none", "read"]}, "decision": "allow"}],
}


@tool(side_effect="read")
def lookup(order: str) -> str:
    """Look an order up.

    Args:
        order: Order id.
    """
    return order


class DropExporter(SpanExporter):
    """Accepts every batch and throws it away: the cost of the SDK without a network."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()
    return port


class _StubSpan:
    """What the gate calls on a span, doing nothing: the gate's cost without any telemetry."""

    trace_id = span_id = None
    recording = capturing = False  # read as flags by the gate: a method from __getattr__ would be truthy

    def __enter__(self) -> _StubSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def _nothing(self, *args: object, **kwargs: object) -> None:
        pass

    describe = arguments = decision = budget = approval = result = finish = _nothing

    def log_fields(self) -> dict[str, str]:
        return {}


_STUB = _StubSpan()


def _setups() -> dict[str, Callable[[], tuple[Tracer | None, Callable[[], None]]]]:
    def none() -> tuple[Tracer | None, Callable[[], None]]:
        namespace = vars(gate_module)
        original = namespace["tool_span"]
        namespace["tool_span"] = lambda *args, **kwargs: _STUB

        def restore() -> None:
            namespace["tool_span"] = original

        return None, restore

    def no_sdk() -> tuple[Tracer | None, Callable[[], None]]:
        return None, lambda: None

    def sdk(sampler: Any, exporter: SpanExporter, with_metrics: bool = False
            ) -> tuple[Tracer | None, Callable[[], None]]:
        provider = TracerProvider(sampler=sampler, shutdown_on_exit=False)
        provider.add_span_processor(BatchSpanProcessor(exporter))
        meters: MeterProvider | None = None
        if with_metrics:
            meters = MeterProvider(metric_readers=[InMemoryMetricReader()], shutdown_on_exit=False)
            proctor_metrics.use_meter_provider(meters)

        def close() -> None:
            proctor_metrics.use_meter_provider(None)
            provider.shutdown()
            if meters is not None:
                meters.shutdown()

        return provider.get_tracer("proctor"), close

    def otlp_dead() -> tuple[Tracer | None, Callable[[], None]]:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return sdk(ALWAYS_ON, OTLPSpanExporter(endpoint=f"http://127.0.0.1:{_closed_port()}/v1/traces", timeout=1))

    return {
        "none": none,
        "no-sdk": no_sdk,
        "sampled-drop": lambda: sdk(ALWAYS_ON, DropExporter()),
        "sampled-otlp": otlp_dead,
        "sampled+metrics": lambda: sdk(ALWAYS_ON, DropExporter(), with_metrics=True),
        "sampler-off": lambda: sdk(ALWAYS_OFF, DropExporter()),
    }


def measure(tracer: Tracer | None, calls: int) -> list[float]:
    gate = Gate(Policy.from_dict(POLICY), tracer=tracer, tools=[lookup])  # type: ignore[arg-type]
    ctx = gate.start_run()
    for i in range(500):  # warm up caches, the policy's compiled matchers, the batch worker
        gate.call("lookup", {"order": str(i)}, context=ctx)
    out: list[float] = []
    clock = time.perf_counter_ns
    for _ in range(calls):
        began = clock()
        gate.call("lookup", {"order": "A1"}, context=ctx)
        out.append((clock() - began) / 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per set-up; the best round is reported")
    args = parser.parse_args()
    results: dict[str, tuple[float, float, float]] = {}
    setups = _setups()
    for _ in range(args.rounds):
        for name, make in setups.items():
            tracer, close = make()
            try:
                samples = sorted(measure(tracer, args.calls))
            finally:
                close()
            stats = (samples[len(samples) // 2], samples[int(len(samples) * 0.99)], statistics.fmean(samples))
            if name not in results or stats[0] < results[name][0]:
                results[name] = stats
    base = results["none"][0]
    print(f"{'set-up':<17}{'p50 µs':>9}{'p99 µs':>9}{'mean µs':>9}{'p50 - none':>12}")
    for name, (p50, p99, mean) in results.items():
        print(f"{name:<17}{p50:>9.1f}{p99:>9.1f}{mean:>9.1f}{p50 - base:>+12.1f}")


if __name__ == "__main__":
    main()
