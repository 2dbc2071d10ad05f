"""Command-line wiring for telemetry, for the commands that govern calls (`run`, `demo`, `runs resume`, `serve`,
`mcp serve`).

    from proctor.cli.telemetry import add_telemetry_arguments, cli_telemetry

    add_telemetry_arguments(run_parser)          # --otlp, --otlp-protocol, --trace-console, …
    def _run(ns):
        with cli_telemetry(ns):                  # configure logs and export; flush at the end
            ...

Import-light: the SDK and exporters are imported only when export is turned on.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["add_telemetry_arguments", "cli_telemetry", "telemetered"]


def add_telemetry_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the telemetry and logging options to a subcommand's parser."""
    group = parser.add_argument_group("telemetry", "spans and metrics over OTLP (also set by OTEL_* variables)")
    group.add_argument("--otlp", metavar="ENDPOINT", default=None,
                       help="send spans and metrics to this OTLP endpoint, e.g. http://localhost:4317 "
                            "(default: OTEL_EXPORTER_OTLP_ENDPOINT, if set)")
    group.add_argument("--otlp-protocol", choices=("grpc", "http/protobuf"), default=None,
                       help="OTLP protocol (default: OTEL_EXPORTER_OTLP_PROTOCOL, else by port: 4318 http, else grpc)")
    group.add_argument("--trace-console", action="store_true",
                       help="print one line per finished span to stderr")
    group.add_argument("--capture-content", action="store_true", default=None,
                       help="record tool arguments and results on spans (redacted as in the audit log)")
    group.add_argument("--log-format", choices=("auto", "json", "console"), default="auto",
                       help="log format: JSON lines when stderr is not a terminal (auto), or forced")
    group.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="error",
                       help="least severe library log level written to stderr (default: error; what a warning "
                            "would say, such as a replaced worker, is already in the run's own output)")


@contextmanager
def cli_telemetry(ns: argparse.Namespace) -> Iterator[None]:
    """Configure logging and export from the parsed options; flush (at most 5 s) on the way out.

    An invalid endpoint or protocol is a usage error: one line on stderr, exit status 2.
    """
    from proctor.telemetry.logging import configure_logging
    from proctor.telemetry.setup import configure_tracing, shutdown

    log_format = getattr(ns, "log_format", "auto")
    configure_logging(json=None if log_format == "auto" else log_format == "json",
                      level=getattr(ns, "log_level", "error"))
    try:
        configure_tracing(otlp_endpoint=getattr(ns, "otlp", None), protocol=getattr(ns, "otlp_protocol", None),
                          console=bool(getattr(ns, "trace_console", False)),
                          capture_content=getattr(ns, "capture_content", None))
    except ValueError as exc:
        print(f"proctor: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        yield
    finally:
        shutdown()


def telemetered(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """`command` run under `cli_telemetry`: for a subcommand's ``set_defaults(func=…)``."""

    def run(ns: argparse.Namespace) -> int:
        with cli_telemetry(ns):
            return command(ns)

    return run
