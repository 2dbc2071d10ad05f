"""``proctor demo``: the first thing to run. A support agent under a policy, offline, in a few seconds.

The work happens in `proctor.agent.demo.app`; this module only registers the
command, so ``proctor --help`` stays fast.
"""

from __future__ import annotations

import argparse
from typing import Any

from proctor.termsafe import terminal_safe

__all__ = ["main", "register"]


def register(subparsers: Any) -> None:
    """Add ``proctor demo`` to the command line."""
    parser = subparsers.add_parser(
        "demo",
        help="watch a scripted support agent be allowed, denied, asked about and stopped by a policy",
        description="Run a customer-support agent, played by a scripted model (no API key, no network), "
        "under the demo policy shipped with proctor: calls inside its programs are allowed, denied, "
        "sent to a human, and finally stopped by a budget. Writes and verifies an audit log.",
    )
    answer = parser.add_mutually_exclusive_group()
    answer.add_argument("--yes", dest="answer", action="store_const", const=True,
                        help="approve every approval request automatically")
    answer.add_argument("--no", dest="answer", action="store_const", const=False,
                        help="deny every approval request automatically")
    parser.add_argument("--audit", metavar="PATH",
                        help="where to write the audit log (default: a fresh temporary directory)")
    from proctor.cli.telemetry import add_telemetry_arguments

    add_telemetry_arguments(parser)  # --otlp URL, --trace-console, …
    parser.set_defaults(func=main, answer=None)


def main(args: argparse.Namespace) -> int:
    """Run the demo; 0 when it played through and its audit log verifies."""
    import sys

    from proctor.agent.demo.app import DemoOptions, run_demo
    from proctor.errors import ProctorError
    from proctor.telemetry.logging import configure_logging

    # The demo's own output is the show: library logs go to stderr, warnings and worse by default.
    log_format = getattr(args, "log_format", "auto")
    configure_logging(json=None if log_format == "auto" else log_format == "json",
                      level=getattr(args, "log_level", "warning"), stream=sys.stderr)
    try:
        code, _ = run_demo(DemoOptions(answer=args.answer, audit=args.audit, otlp=args.otlp,
                                       otlp_protocol=getattr(args, "otlp_protocol", None),
                                       trace_console=args.trace_console,
                                       capture_content=getattr(args, "capture_content", None)))
    except ValueError as exc:  # a bad --otlp URL, for instance
        print(terminal_safe(f"proctor demo: {exc}"), file=sys.stderr)
        return 2
    except (ProctorError, OSError) as exc:  # an audit path that cannot be written, a locked log…
        print(terminal_safe(f"proctor demo: {exc}"), file=sys.stderr)
        return 1
    return code
