"""``proctor run``: one governed agent run from the command line.

    proctor run "Refund order A-1041" --tools examples.tools_demo --policy policy.yaml \\
        --model openai/gpt-4o-mini --audit audit.jsonl

Exit status: 0 the run finished with an answer, 1 it did not (max steps, budget,
error, or a policy that does not load), 2 usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from proctor.termsafe import terminal_safe
from proctor.urls import shown_url

__all__ = ["main", "register"]


def key_value(text: str) -> tuple[str, Any]:
    """An argparse type: KEY=VALUE, the value read as JSON when it is JSON (its shape checked first), else text."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    from proctor.jsoninput import shape_problem

    problem = shape_problem(value, key)  # json.loads would recurse once per level
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value  # not JSON: the text itself


def register(subparsers: Any) -> None:
    """Add ``proctor run`` to the command line."""
    from proctor.cli.telemetry import add_telemetry_arguments

    p = subparsers.add_parser(
        "run", help="run an agent on a task, every tool call governed by a policy",
        description="Run a CodeAgent (or a ToolCallingAgent) on TASK with the given tools, policy and model. "
        "Every tool call is decided by the policy, approved when it says so, audited and traced.",
    )
    p.add_argument("task", metavar="TASK", help="what the agent should do")
    p.add_argument("--tools", metavar="MOD[:ATTR]", action="append", required=True,
                   help="tools: a module of @tool functions, or MOD:ATTR naming a tool or a list (repeatable)")
    p.add_argument("--policy", metavar="P", required=True, help="the policy file (YAML)")
    p.add_argument("--shadow", metavar="P",
                   help="a candidate policy that decides every call beside --policy and never acts: where it "
                        "disagrees, a shadow_decision record (docs/operations.md)")
    p.add_argument("--model", metavar="ID", required=True,
                   help="a litellm model id: openai/gpt-4o-mini, anthropic/claude-3-5-haiku-latest, "
                        "ollama_chat/qwen2.5-coder:7b …")
    p.add_argument("--model-arg", metavar="KEY=VALUE", action="append", type=key_value, default=[],
                   help="extra litellm argument, e.g. api_base=http://localhost:11434 or temperature=0 (repeatable)")
    p.add_argument("--approver", metavar="SPEC", default="console",
                   help="console (default) or webhook:URL (secret in $PROCTOR_WEBHOOK_SECRET)")
    p.add_argument("--audit", metavar="PATH|URL",
                   help="append the audit trail to this log, or to postgresql://…?log=NAME shared by a fleet "
                        "(default: $PROCTOR_AUDIT, else $XDG_STATE_HOME/proctor/audit.jsonl, "
                        "i.e. ~/.local/state/proctor/audit.jsonl)")
    p.add_argument("--ledger", metavar="URL", default=None,
                   help="where budgets shared between runs live: redis://host:6379/0 for a fleet "
                        "(default $PROCTOR_LEDGER, else this process)")
    p.add_argument("--audit-key", metavar="PATH",
                   help="Ed25519 private key (PEM) signing the log's checkpoints (default: $PROCTOR_AUDIT_KEY); "
                        "make one with `proctor audit keygen PATH`")
    p.add_argument("--no-audit", action="store_true",
                   help="run without an audit trail (said on stderr; the policy still decides every call)")
    p.add_argument("--agent", choices=("code", "tool-calling"), default="code",
                   help="code: the model writes Python (default); tool-calling: native function calls")
    p.add_argument("--max-steps", metavar="N", type=int, default=20, help="stop after N steps (default 20)")
    p.add_argument("--import", dest="imports", metavar="MODULE", action="append", default=[],
                   help="a module programs may import (repeatable; code agent)")
    p.add_argument("--sandbox", choices=("auto", "bwrap", "process"), default="auto",
                   help="worker isolation for the code agent (default auto: bwrap when available)")
    p.add_argument("--timeout", metavar="SECONDS", type=float, default=30.0,
                   help="time limit of one program (default 30)")
    p.add_argument("--image", dest="images", metavar="PATH", action="append", default=[],
                   help="an image the model is shown with the task: PNG, JPEG, GIF or WebP (repeatable; "
                        "needs Pillow: pip install 'proctor[images]')")
    p.add_argument("--principal", metavar="NAME", help="who runs the agent (policy: run.principal)")
    p.add_argument("--label", metavar="KEY=VALUE", action="append", type=key_value, default=[],
                   help="a run label (policy: run.labels; repeatable)")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout, nothing else")
    add_telemetry_arguments(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Run the agent; print the steps and a summary (or JSON)."""
    from proctor.agent.loading import ToolLoadError, load_tools
    from proctor.backends import AUDIT_KEY_ENV, default_audit_path
    from proctor.cli.telemetry import cli_telemetry
    from proctor.errors import AuditError, ConfigurationError, ImageError, PolicyError, SandboxError

    if args.max_steps < 1:
        print("proctor run: --max-steps must be at least 1", file=sys.stderr)
        return 2
    try:
        tools = load_tools(args.tools)
        from proctor.approval.spec import approver_from_spec

        approver = approver_from_spec(args.approver)
    except (ToolLoadError, ValueError) as exc:
        print(terminal_safe(f"proctor run: {exc}"), file=sys.stderr)
        return 2
    try:
        from proctor.policy import Policy
        from proctor.policy.reload import PolicySource

        policy = PolicySource(args.policy)  # reloaded when the file changes during the run, as a gate's path is
        args.shadow = Policy.from_yaml(args.shadow) if args.shadow else None
    except PolicyError as exc:
        print(terminal_safe(str(exc), keep_newlines=True), file=sys.stderr)
        return 1
    if args.images:  # read and checked before anything starts
        from proctor.images import load_image

        try:
            args.images = [load_image(path, "--image") for path in args.images]
        except ImageError as exc:
            print(terminal_safe(f"proctor run: {exc}"), file=sys.stderr)
            return 2
    if args.no_audit and args.audit:
        print("proctor run: --audit and --no-audit contradict each other; give one", file=sys.stderr)
        return 2
    if args.no_audit:
        print("proctor run: no audit trail (--no-audit): nothing of this run is recorded", file=sys.stderr)
    else:
        args.audit = args.audit or default_audit_path()
        key = args.audit_key or os.environ.get(AUDIT_KEY_ENV) or None
        print(f"proctor run: audit trail: {shown_url(args.audit)}" + (" (signed)" if key else
              f" (unsigned: --audit-key or ${AUDIT_KEY_ENV} signs it)"), file=sys.stderr)
    with cli_telemetry(args):
        try:
            return _run(args, tools, policy, approver)
        except (AuditError, ConfigurationError, SandboxError) as exc:  # refused to start: one line says why
            print(terminal_safe(f"proctor run: {exc}"), file=sys.stderr)
            return 1



def _run(args: argparse.Namespace, tools: list[Any], policy: Any, approver: Any) -> int:
    from rich.console import Console

    from proctor.agent.base import AgentBase
    from proctor.agent.code_agent import CodeAgent
    from proctor.agent.models import LiteLLMModel
    from proctor.agent.progress import PausingApprover, ProgressLine
    from proctor.agent.render import StepPrinter, summary_table
    from proctor.agent.tool_calling import ToolCallingAgent

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 110)
    printer = StepPrinter(console)
    # On a terminal, a live line while each program runs; on a pipe or in CI, nothing (see progress.py).
    progress = ProgressLine(sys.stdout, enabled=None if not args.json else False)
    if progress.enabled:
        # The console approver asks at this terminal: the line steps aside; others ask elsewhere.
        approver = PausingApprover.around(approver, progress, terminal=args.approver == "console")
    callbacks: dict[str, Any] = {} if args.json else {"program_callbacks": [printer.program, progress.start],
                                                       "step_callbacks": [progress.stop, printer.done]}
    model = LiteLLMModel(args.model, **dict(args.model_arg))
    agent: AgentBase
    if args.agent == "code":
        agent = CodeAgent(tools, model, policy, approver=approver, audit=args.audit, max_steps=args.max_steps,
                          authorized_imports=args.imports, sandbox=args.sandbox, timeout=args.timeout,
                          audit_key=args.audit_key, ledger=args.ledger, shadow=args.shadow, **callbacks)
    else:
        agent = ToolCallingAgent(tools, model, policy, approver=approver, audit=args.audit,
                                 max_steps=args.max_steps, audit_key=args.audit_key,
                                 ledger=args.ledger, shadow=args.shadow, **callbacks)
    if progress.enabled:
        agent.call_listeners.append(progress.call)
    with agent:
        try:
            result = agent.run(args.task, principal=args.principal, labels={k: str(v) for k, v in args.label},
                               images=args.images or None)
        finally:
            progress.stop()  # an interrupt must not leave the line on the terminal
    if args.json:
        print(json.dumps(result.as_dict(), default=str, indent=2))
    else:
        limits = {b.name: b.limit.model_dump() for b in policy.current().budgets}  # as the run ended under
        console.print()
        console.print(summary_table(result, limits=limits))
    if result.status == "error" and not args.json:
        print(terminal_safe(f"proctor run: {result.error}", keep_newlines=True), file=sys.stderr)
    return 0 if result.status == "done" else 1

