"""structlog configuration: JSON or console, ids of run, call, trace and span, and a quiet library default."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from proctor.calls import RunInfo
from proctor.telemetry import agent_span, tool_span
from proctor.telemetry.logging import bind_call, bind_run, configure_logging, get_logger
from proctor.testing import SpanCapture


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    structlog.reset_defaults()  # whatever an earlier test configured
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


def _lines(stream: io.StringIO, logger: str = "proctor") -> list[dict[str, object]]:
    """Lines of loggers under `logger`: exporter threads left by other tests may log through the same root handler."""
    lines = [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]
    return [line for line in lines if str(line.get("logger", "proctor")).startswith(logger)]


def test_library_logger_is_quiet_until_configured(capsys: pytest.CaptureFixture[str],
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """Unconfigured, library events go to the logging module (warnings and up), never to stdout."""
    assert not structlog.is_configured()
    log = get_logger("proctor.gate")
    with caplog.at_level(logging.WARNING, logger="proctor.gate"), bind_run("run_7"):
        log.info("routine", n=1)
        log.error("audit_write_failed", kind="call_intent")
    out = capsys.readouterr()
    assert out.out == ""
    assert [r.getMessage() for r in caplog.records] == ["audit_write_failed run_id='run_7' kind='call_intent'"]


def test_json_lines_carry_run_call_trace_and_span_ids() -> None:
    """Configured for JSON, an event inside a run, a call and a span carries all four ids."""
    stream = io.StringIO()
    configure_logging(json=True, level="info", stream=stream)
    capture = SpanCapture()
    log = get_logger("proctor.agent")
    with agent_span(capture.tracer, agent_name="a", run=RunInfo(id="run_1")) as run, bind_run("run_1"), \
            bind_call("call_1"):
        log.info("step_started", step=1)
    (line,) = _lines(stream)
    assert line["event"] == "step_started" and line["level"] == "info" and line["step"] == 1
    assert line["run_id"] == "run_1" and line["call_id"] == "call_1" and line["logger"] == "proctor.agent"
    assert line["trace_id"] == run.trace_id and line["span_id"] == run.span_id
    assert str(line["timestamp"]).endswith("Z")


def test_explicit_span_fields_win_over_the_current_span() -> None:
    """A tool span is never current, so the gate passes its ids; they are kept as given."""
    stream = io.StringIO()
    configure_logging(json=True, stream=stream)
    capture = SpanCapture()
    with tool_span(capture.tracer, tool="t", call_id="call_3", run=RunInfo(id="run_3")) as span:
        structlog.get_logger("proctor.gate").error("gate_internal_error", **span.log_fields())
        span.finish("ok")
    (line,) = _lines(stream)
    assert line["trace_id"] == span.trace_id and line["span_id"] == span.span_id
    assert line["run_id"] == "run_3" and line["call_id"] == "call_3"


def test_level_filtering_and_console_format() -> None:
    """Below the configured level nothing is written; the console format is readable text, not JSON."""
    stream = io.StringIO()
    configure_logging(json=False, level="warning", stream=stream)
    log = get_logger("proctor.gate")
    log.info("hidden")
    log.warning("shown", tool="lookup")
    text = stream.getvalue()
    assert "hidden" not in text and "shown" in text and "tool" in text and "lookup" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text.splitlines()[0])


def test_auto_format_is_json_off_a_terminal() -> None:
    """With json=None, a stream that is not a TTY gets JSON lines."""
    stream = io.StringIO()
    configure_logging(stream=stream)
    structlog.get_logger().warning("x")
    assert _lines(stream)[0]["event"] == "x"


def test_stdlib_records_are_rendered_too() -> None:
    """Warnings of other libraries (the OTel exporters') come out in the same format."""
    stream = io.StringIO()
    configure_logging(json=True, stream=stream)
    logging.getLogger("opentelemetry.exporter.test").warning("Failed to export %s", "spans")
    (line,) = _lines(stream, "opentelemetry.exporter.test")
    assert line["event"] == "Failed to export spans" and line["level"] == "warning"
    assert line["logger"] == "opentelemetry.exporter.test"


def test_unknown_level_is_an_error() -> None:
    """A misspelt level is refused with the valid ones named."""
    with pytest.raises(ValueError, match="use debug, info"):
        configure_logging(level="loud")


def test_without_a_stream_lines_go_to_the_stderr_of_the_moment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Logging configured on one sys.stderr follows a later swap; a closed earlier stderr is never written to."""
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr("sys.stderr", first)
    configure_logging(json=True, stdlib=False)
    first.close()  # what a test runner's capture or a daemonising process does to the old stream
    monkeypatch.setattr("sys.stderr", second)
    get_logger("proctor.test").error("after_the_swap", n=1)
    [line] = _lines(second, "proctor.test")
    assert line["event"] == "after_the_swap" and line["n"] == 1
