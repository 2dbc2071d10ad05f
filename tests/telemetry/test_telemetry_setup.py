"""configure_tracing: OTEL_* variables, protocol choice, sampler, headers, console output and CLI options."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator

import pytest
import structlog
from opentelemetry import metrics as otel_metrics
from opentelemetry import trace as otel_trace
from otlp_receivers import HttpReceiver

from proctor.calls import RunInfo
from proctor.cli.telemetry import add_telemetry_arguments, cli_telemetry
from proctor.telemetry import metrics as proctor_metrics
from proctor.telemetry import setup, tool_span

_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
         "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_SERVICE_NAME",
         "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_EXPORTER_OTLP_HEADERS")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in _VARS:
        monkeypatch.delenv(name, raising=False)
    yield
    proctor_metrics.use_meter_provider(None)
    setup.shutdown(1.0)


@pytest.fixture
def receiver() -> Iterator[HttpReceiver]:
    recv = HttpReceiver()
    yield recv
    recv.close()


def test_nothing_configured_means_no_provider() -> None:
    """Without an endpoint, a variable or console output, nothing is set up (spans stay no-ops)."""
    assert setup.configure_tracing(set_global=False) is None


def test_traces_exporter_none_wins_over_the_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """OTEL_TRACES_EXPORTER=none turns export off even when an endpoint variable is set."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4317")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert setup.configure_tracing(set_global=False) is None


@pytest.mark.parametrize(("env", "arg", "expected"), [
    ({}, "http://collector:4318", ("http://collector:4318", "http/protobuf", False)),
    ({}, "collector:4317", ("http://collector:4317", "grpc", False)),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, "https://otel.example.com",
     ("https://otel.example.com", "http/protobuf", False)),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4317"}, None, ("http://a:4317", "grpc", False)),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4317", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:4318/v1/traces"},
     None, ("http://b:4318/v1/traces", "http/protobuf", True)),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, "http://c:9",
     ("http://c:9", "http/protobuf", False)),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, None, ("http://localhost:4318", "http/protobuf", False)),
])
def test_endpoint_and_protocol_resolution(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], arg: str | None,
                                          expected: tuple[str, str, bool]) -> None:
    """The argument beats the variables, per-signal variables beat general ones, and the port picks the protocol."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert setup.resolve_endpoint(arg, None) == expected


def test_invalid_protocol_and_endpoint_are_one_line_errors() -> None:
    """http/json (not supported by the Python exporters) and a URL without a host are refused."""
    with pytest.raises(ValueError, match="use grpc or http/protobuf"):
        setup.resolve_endpoint("http://x:1", "http/json")
    with pytest.raises(ValueError, match="invalid OTLP endpoint"):
        setup.resolve_endpoint("http://", None)


def test_env_endpoint_headers_service_and_sampler(monkeypatch: pytest.MonkeyPatch, receiver: HttpReceiver) -> None:
    """Standard variables alone configure export: endpoint, protocol, headers, service name and sampler."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-scope-orgid=ops,authorization=Bearer%20t0k")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "billing-agent")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    provider = setup.configure_tracing(set_global=False)
    assert provider is not None
    tracer = provider.get_tracer("proctor")
    with tool_span(tracer, tool="t", call_id="c", run=RunInfo()) as span:
        span.finish("ok")
    assert setup.shutdown(5.0)
    (got,) = receiver.wait_for(lambda s: len(s) >= 1)
    assert got.resource["service.name"] == "billing-agent"
    assert receiver.headers[0]["x-scope-orgid"] == "ops"
    assert receiver.headers[0]["authorization"] == "Bearer t0k"
    assert not receiver.metric_names  # OTEL_METRICS_EXPORTER=none

    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    provider = setup.configure_tracing(set_global=False)
    assert provider is not None
    with tool_span(provider.get_tracer("proctor"), tool="t", call_id="c", run=RunInfo()) as span:
        assert not span.recording


def test_console_prints_one_line_per_span(capsys: pytest.CaptureFixture[str]) -> None:
    """--trace-console: a compact line per finished span on stderr, nothing on stdout."""
    provider = setup.configure_tracing(console=True, set_global=False)
    assert provider is not None
    with tool_span(provider.get_tracer("proctor"), tool="wipe", call_id="c", run=RunInfo(id="run_5")) as span:
        span.finish("denied", "ToolDenied", "never")
    out = capsys.readouterr()
    assert out.out == ""
    line = out.err.strip()
    assert line.startswith("[span] execute_tool wipe ") and " ERROR " in line
    assert "decision" not in line and "status=denied" in line and "error=ToolDenied" in line


def test_cli_options(receiver: HttpReceiver, capsys: pytest.CaptureFixture[str],
                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI helper parses --otlp and friends, exports, flushes on exit; a bad endpoint exits 2."""
    # The CLI installs process-wide providers and logging; keep them out of the other tests.
    installed: list[object] = []
    monkeypatch.setattr(otel_trace, "set_tracer_provider", installed.append)
    monkeypatch.setattr(otel_metrics, "set_meter_provider", installed.append)
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    parser = argparse.ArgumentParser()
    add_telemetry_arguments(parser)
    ns = parser.parse_args(["--otlp", receiver.endpoint, "--otlp-protocol", "http/protobuf", "--log-format", "json"])
    with cli_telemetry(ns):
        tracer = setup.current()
        assert tracer is not None and tracer.tracer_provider is not None
        with tool_span(tracer.tracer_provider.get_tracer("proctor"), tool="t", call_id="c", run=RunInfo()) as s:
            s.finish("ok")
    assert receiver.wait_for(lambda got: len(got) >= 1)
    with pytest.raises(SystemExit) as info, cli_telemetry(parser.parse_args(["--otlp", "http://"])):
        pass
    assert info.value.code == 2
    assert "invalid OTLP endpoint" in capsys.readouterr().err
    assert len(installed) == 2  # a tracer and a meter provider would have been made global
    structlog.reset_defaults()
