"""``proctor demo``: the first thing to run. A support agent under a policy, offline, in a few seconds.

The work happens in `proctor.agent.demo.app`; this module only registers the
command, so ``proctor --help`` stays fast.
"""

from __future__ import annotations

import argparse
from typing import Any

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
    parser.add_argument("--otlp", metavar="URL", help="export spans over OTLP to URL (e.g. http://localhost:4318)")
    parser.add_argument("--trace-console", action="store_true", help="print each span to stderr as it ends")
    parser.set_defaults(func=main, answer=None)


def main(args: argparse.Namespace) -> int:
    """Run the demo; 0 when it played through and its audit log verifies."""
    import sys

    from proctor.agent.demo.app import DemoOptions, run_demo
    from proctor.telemetry.logging import configure_logging

    # The demo's own output is the show: keep library logs to warnings, on stderr.
    configure_logging(level="warning", stream=sys.stderr)
    try:
        code, _ = run_demo(DemoOptions(answer=args.answer, audit=args.audit, otlp=args.otlp,
                                       trace_console=args.trace_console))
    except ValueError as exc:  # a bad --otlp URL, for instance
        print(f"proctor demo: {exc}", file=sys.stderr)
        return 2
    return code
