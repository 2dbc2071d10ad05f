"""A collector that is down or hangs never fails a tool call, never slows it, and cannot hang shutdown."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from otlp_receivers import BlackHole, closed_port
from tel_helpers import make_gate

from proctor.telemetry import metrics as proctor_metrics
from proctor.telemetry import setup

CALLS = 400


@pytest.fixture(autouse=True)
def _small_queue_short_timeout(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # A queue far smaller than the number of calls, so the test also covers "queue full: drop".
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "64")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "32")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "10")
    # Each export waits up to 2 s, far longer than a call may take; the abandoned background
    # work ends soon after the test.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")
    before = set(threading.enumerate())
    yield
    proctor_metrics.use_meter_provider(None)
    # The export work the test abandoned logs that it gave up once its 2 s are out: waited for here, so that the
    # line is written during this test and not into the stderr of whichever test runs next in this process.
    deadline = time.monotonic() + 10
    for thread in set(threading.enumerate()) - before:
        if thread.name.startswith(("OtelBatch", "proctor-telemetry-shutdown")):
            thread.join(max(0.0, deadline - time.monotonic()))


@pytest.fixture(params=["down", "hung"])
def collector(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "down":
        yield closed_port()
        return
    hole = BlackHole()
    try:
        yield hole.endpoint
    finally:
        hole.close()


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_calls_stay_fast_and_succeed(collector: str, protocol: str) -> None:
    """Hundreds of sampled calls succeed at normal speed while every export fails or hangs."""
    provider = setup.configure_tracing(otlp_endpoint=collector, protocol=protocol, set_global=False)
    assert provider is not None
    telemetry = setup.current()
    assert telemetry is not None
    tracer = provider.get_tracer("proctor")
    gate = make_gate(tracer)
    ctx = gate.start_run()
    durations: list[float] = []
    results: list[Any] = []
    for i in range(CALLS):
        began = time.perf_counter()
        results.append(gate.call("lookup", {"order": str(i)}, context=ctx))
        durations.append(time.perf_counter() - began)
    assert results == [f"order {i}: shipped" for i in range(CALLS)]
    # The batch worker blocks up to 2 s per export; the calls must not. The bounds are loose
    # because the machine is shared, but a call that waited on an export would exceed them.
    assert statistics.median(durations) < 0.005, statistics.median(durations)
    assert max(durations) < 1.0, max(durations)

    began = time.perf_counter()
    telemetry.shutdown(timeout_s=1.0)
    assert time.perf_counter() - began < 2.0
