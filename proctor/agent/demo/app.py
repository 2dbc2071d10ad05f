"""``proctor demo``: a support agent, played by a scripted model, under the demo policy.

It shows the four things proctor does to calls inside model-written code: allow,
deny, ask a human, and stop the run at a budget; then verifies the audit log it wrote.
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from proctor.agent.code_agent import CodeAgent
from proctor.agent.demo import policy_path, script
from proctor.agent.demo.tools import Shop, make_tools
from proctor.agent.models import ScriptedModel
from proctor.agent.observations import format_args
from proctor.agent.render import DECISION_STYLE as _DECISION_STYLE
from proctor.agent.render import StepPrinter, summary_table
from proctor.agent.result import RunResult
from proctor.approval import ApprovalDecision, ApprovalRequest, Approver, CallbackApprover, ConsoleApprover
from proctor.interpreter.sandbox import describe_sandbox
from proctor.policy import Policy
from proctor.termsafe import terminal_safe

__all__ = ["DemoOptions", "run_demo"]


@dataclass
class DemoOptions:
    """What ``proctor demo`` was asked for."""

    answer: bool | None = None  # --yes / --no; None asks on a terminal (yes without one)
    audit: str | None = None
    otlp: str | None = None
    otlp_protocol: str | None = None
    trace_console: bool = False
    capture_content: bool | None = None
    interactive: bool | None = None  # None: decide from the terminal


def _approver(opts: DemoOptions, console: Console) -> tuple[Approver, str]:
    interactive = opts.interactive
    if interactive is None:
        interactive = sys.stdin.isatty() and sys.stdout.isatty()
    if opts.answer is None and interactive:
        return ConsoleApprover(timeout=120), "you, at this terminal (answer the prompt when it appears)"
    verdict = True if opts.answer is None else opts.answer
    why = ("--yes" if opts.answer else "--no") if opts.answer is not None else "no terminal"
    word = "approve" if verdict else "deny"

    def decide(request: ApprovalRequest) -> ApprovalDecision | bool:
        console.print(Text.assemble(
            ("  approval needed: ", "bold yellow"), f"{request.tool}({format_args(request.args, 70)})",
            (f" - {request.reason}\n", "dim"),
            ("  answered automatically: ", "bold yellow"), (word.upper(), "bold"), f" ({why})"))
        if verdict:
            return ApprovalDecision.approve(request, f"demo:{why}", "auto-approved by the demo")
        return ApprovalDecision.deny(request, f"demo:{why}", "auto-denied by the demo (--no)")

    how = f"answered automatically: {word} ({why}; run on a terminal to answer yourself)"
    return CallbackApprover(decide, name=f"demo:{why}"), how


def _tracer(opts: DemoOptions) -> tuple[Any, Any, str]:
    """(tracer, span exporter for counting, note): the SDK when installed, else tracing off."""
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    except ImportError:
        return None, None, "tracing is off: pip install 'proctor[otel]' for spans and a trace id"
    from proctor.telemetry.setup import configure_tracing

    # OTEL_SERVICE_NAME, when set, names the service; metrics follow the spans to the same endpoint.
    provider = configure_tracing(otlp_endpoint=opts.otlp, protocol=opts.otlp_protocol, console=opts.trace_console,
                                 service_name=os.environ.get("OTEL_SERVICE_NAME") or "proctor-demo",
                                 capture_content=opts.capture_content, set_global=False)
    endpoint = opts.otlp or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT")
    # Said after the flush, from what the exporter really delivered (see `_export_note`).
    note = f"export to {endpoint}" if provider is not None and endpoint else (
        "spans kept in memory (--otlp URL to export)")
    if provider is None:
        provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("proctor"), exporter, note


def _audit_paths(opts: DemoOptions) -> Path:
    if opts.audit:
        return Path(opts.audit)
    return Path(tempfile.mkdtemp(prefix="proctor-demo-")) / "audit.jsonl"


def _intro(console: Console, policy: Policy, approval: str, audit_path: Path) -> None:
    console.print(Panel(
        Text.assemble(
            ("A customer-support agent handles a ticket. A scripted model plays the LLM: it writes Python "
             "that calls tools through aliases, comprehensions, map() and helper functions. Every call "
             "stops at proctor's gate before it runs.\n\n"),
            ("policy     ", "bold"), f"{policy.source}\n",
            ("approvals  ", "bold"), f"{approval}\n",
            ("audit log  ", "bold"), f"{audit_path}\n",
            ("sandbox    ", "bold"), describe_sandbox("auto"),
        ),
        title="proctor demo", title_align="left", border_style="cyan"))
    rules = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, title="the policy", title_justify="left")
    rules.add_column("rule / budget", style="bold")
    rules.add_column("applies to")
    rules.add_column("when / limit", overflow="fold")
    rules.add_column("decision")
    for rule in policy.rules:
        match = rule.match
        target = ", ".join([*(match.tool or ()), *(match.side_effect or ())]) if match else "every call"
        rules.add_row(rule.name, target, Text(rule.when or "always"),
                      Text(rule.decision, style=_DECISION_STYLE.get(rule.decision, "")))
    for budget in policy.budgets:
        limits = ", ".join(f"{k}={v:g}" + ("s" if k == "wall_time" else "")
                           for k, v in budget.limit.model_dump().items() if v is not None)
        target = ", ".join(budget.match.tool or budget.match.side_effect or ()) if budget.match else "the run"
        rules.add_row(budget.name, target, limits, Text("budget", style="cyan"))
    console.print(rules)
    console.print(Text("task: ", style="bold") + Text(script.TASK))


def _export_note(note: str) -> str:
    """After flushing: how many spans really reached the collector, or that the export failed."""
    from proctor.telemetry import setup

    telemetry = setup.current()
    if telemetry is None or telemetry.endpoint is None or not note.startswith("export to"):
        return note
    if not setup.shutdown():
        return f"{note} did not finish in time: spans may be lost (is the collector up?)"
    if telemetry.export_failed or not telemetry.exported:
        return (f"{note} FAILED: {telemetry.export_failed} span(s) not delivered, {telemetry.exported} delivered "
                "(is a collector listening there?)")
    return f"{telemetry.exported} spans exported to {telemetry.endpoint}"


def run_demo(opts: DemoOptions, console: Console | None = None) -> tuple[int, RunResult]:
    """Play the demo; return (exit code, the run's result)."""
    from proctor.audit import AuditLog, generate_keypair, verify

    if console is None:
        # Off a terminal rich assumes 80 columns; logs and CI pages are wider than that.
        console = Console(highlight=False, width=None if sys.stdout.isatty() else 110)
    policy = Policy.from_yaml(policy_path())
    audit_path = _audit_paths(opts)
    audit_path.parent.mkdir(parents=True, exist_ok=True)
    key_path = audit_path.with_name(audit_path.name + ".key")
    if not key_path.exists():
        generate_keypair(key_path)
    pub_path = Path(os.fspath(key_path) + ".pub")
    approver, approval_note = _approver(opts, console)
    tracer, spans, trace_note = _tracer(opts)
    _intro(console, policy, approval_note, audit_path)

    shop = Shop.sample()
    printer = StepPrinter(console)
    audit = AuditLog(audit_path, signing_key=key_path)
    try:
        with CodeAgent(make_tools(shop), ScriptedModel(script.responses(), model_id="scripted-demo"), policy,
                       approver=approver, audit=audit, max_steps=8, tracer=tracer, name="support_agent",
                       program_callbacks=[printer.program], step_callbacks=[printer.done]) as agent:
            result = agent.run(script.TASK, principal="demo", labels={"env": "demo"})
    finally:
        audit.close()
    result.audit_path = os.fspath(audit_path)
    report = verify(audit_path, pubkey=pub_path)
    verdict = (f"intact: {report.records} records, {report.signed_checkpoints} signed checkpoint(s)" if report.ok
               else f"FAILED: {report.failure}")
    limits = {b.name: b.limit.model_dump() for b in policy.budgets}
    effects = [f"refund {r['id']} ${r['amount']:.2f} for {r['order_id']}" for r in shop.refunds]
    effects += [f"email to {m['to']}" for m in shop.outbox]
    extra = [("what really ran", "\n".join(effects) or "nothing")]
    if spans is not None:
        trace_note = _export_note(trace_note)
        finished = spans.get_finished_spans()
        tools = sum(1 for s in finished if s.name.startswith("execute_tool "))
        extra.append(("spans", f"{len(finished)} ({tools} execute_tool, one per call); {trace_note}"))
    else:
        extra.append(("spans", trace_note))
    console.print()
    console.print(summary_table(result, limits=limits, verify=verdict, extra=extra))
    console.print(Text("\nnext steps:", style="bold"))
    for command in (f"proctor audit verify {audit_path} --pubkey {pub_path}",
                    f"proctor audit show {audit_path}",
                    f"proctor policy explain {policy_path()} --tool issue_refund "
                    "--args '{\"order_id\": \"A-1057\", \"amount\": 240.0, \"reason\": \"damaged\"}'"):
        console.print(terminal_safe(f"  {command}"), soft_wrap=True, markup=False)
    if spans is not None:
        from proctor.telemetry.setup import shutdown

        shutdown()  # flush exported spans (bounded: a dead collector cannot hold the demo)
    ok = result.status in ("done", "budget_exhausted") and report.ok
    return (0 if ok else 1), result
