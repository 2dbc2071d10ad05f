"""Showing a run on the terminal: each step's program, a table of its calls, and a closing summary.

Used by ``proctor demo`` and ``proctor run``. Works the same without a terminal
(plain text, no colours), so its output can be logged or piped. Everything a model,
a program or a tool wrote goes through `proctor.termsafe.terminal_safe` (as `_t`):
an ESC sequence in a tool result cannot erase the calls table above it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import IO, Any

from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from proctor.agent.observations import format_args, truncate
from proctor.agent.result import RunResult, StepRecord
from proctor.calls import CallRecord
from proctor.termsafe import terminal_safe as _t
from proctor.termsafe import text_safe

__all__ = [
    "DECISION_STYLE",
    "STATUS_STYLE",
    "StepPrinter",
    "calls_table",
    "decision_counts",
    "describe_image",
    "outcome_of",
    "print_run",
    "print_timeline",
    "summary_table",
    "when",
]

DECISION_STYLE = {"allow": "green", "deny": "red", "require_approval": "yellow"}
STATUS_STYLE = {"ok": "green", "denied": "red", "failed": "magenta", "timeout": "magenta"}


def _decision_label(call: CallRecord) -> Text:
    if call.decision is None:
        return Text("refused", style="red")
    text = Text(call.decision.outcome, style=DECISION_STYLE.get(call.decision.outcome, ""))
    if call.decision.rules:
        text.append(f" {_t(', '.join(call.decision.rules))}", style="dim")
    return text


def _status_label(call: CallRecord) -> Text:
    text = Text(call.status, style=STATUS_STYLE.get(call.status, ""))
    if call.status != "ok" and call.error_type:
        text.append(f": {_t(call.error_type)}", style=STATUS_STYLE.get(call.status, ""))
    if call.approval:
        text.append(f" ({_t(call.approval)})", style="dim")
    return text


def calls_table(calls: Sequence[CallRecord], *, title: str | None = None, whole: bool = False) -> Table:
    """One row per call: what was called, its side effect, the decision and rules, and what happened.

    `whole`: every argument in full, wrapped (a record for an audit), not cut to keep the table short."""
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, expand=False)
    table.add_column("#", justify="right", style="dim")
    table.add_column("call", overflow="fold", ratio=5)
    table.add_column("effect", no_wrap=True)
    table.add_column("decision · rule", overflow="fold", ratio=3)
    table.add_column("result", overflow="fold", ratio=3)
    for i, call in enumerate(calls, 1):
        args = format_args(dict(sorted(call.args.items())), 1 << 62) if whole else _call_args(call.args)
        table.add_row(str(i), Text(_t(f"{call.tool}({args})")), Text(_t(call.side_effect)),
                      _decision_label(call), _status_label(call))
    return table


def _call_args(args: Mapping[str, Any], per_value: int = 32, limit: int = 160) -> str:
    """``a='x', n=2`` sorted by name, each value cut on its own so every name stays in view.

    Sorted because the audit log keeps arguments in canonical (sorted) order: a run replayed from
    the log reads the same as one shown from memory.
    """
    parts = []
    for name, value in sorted(args.items()):
        text = format_args({name: value}, len(name) + 1 + per_value)
        parts.append(text)
    joined = ", ".join(parts)
    return joined if len(joined) <= limit else joined[: limit - 1] + "…"


class StepPrinter:
    """Step callbacks that print to `console`: the program before it runs, the calls and output after."""

    def __init__(self, console: Console, *, show_output: bool = True, whole: bool = False) -> None:
        self.console = console
        self.show_output = show_output
        self.whole = whole

    def program(self, step: StepRecord) -> None:
        """Before the step's calls run (so an approval prompt appears after the code that asks for it)."""
        self.console.print()
        self.console.rule(f"[bold]step {step.number}", align="left")
        thought = step.thought
        if thought:
            self.console.print(Text(_t(thought, keep_newlines=True), style="italic cyan"))
        if step.code:
            code = text_safe(step.code)
            self.console.print(Syntax(code, "python", theme="ansi_dark", background_color="default",
                                      word_wrap=True))

    def done(self, step: StepRecord) -> None:
        """After the step: the calls it made, what it printed, its error."""
        if step.kind == "planning":
            plan = Text(_t(step.model_output.strip(), keep_newlines=True))
            self.console.print(Panel(plan, title=f"plan (before step {step.number})",
                                     border_style="dim"))
            return
        if step.tool_calls:
            self.console.print(calls_table(step.tool_calls, whole=self.whole))
        for image in step.images:
            self.console.print(Text(_t(describe_image(image)), style="dim"))
        parts: list[Any] = []
        if self.show_output and step.observation:
            logs = step.observation.split("\n\nTool calls", 1)[0] if step.code else ""
            if logs.startswith("Execution logs:\n"):
                parts.append(Text(_t(truncate(logs[len("Execution logs:\n"):], 1500), keep_newlines=True)))
        if step.error:
            parts.append(Text(_t(truncate(step.error, 600), keep_newlines=True), style="bold red"))
        if parts:
            self.console.print(Panel(Group(*parts), title="output", title_align="left", border_style="dim",
                                     expand=False))


def describe_image(image: Mapping[str, Any]) -> str:
    """One line for an image a step brought in: where from, format, size, bytes and digest (never the image)."""
    source = "with the task" if image.get("from") == "task" else f"from {image.get('tool') or 'a call'}"
    digest = str(image.get("sha256") or "")[:16]
    return (f"image {source}: {image.get('format')} {image.get('width')}x{image.get('height')}, "
            f"{image.get('bytes')} bytes, sha256 {digest}…")


def outcome_of(call: CallRecord) -> str:
    """What happened to a call, in words: allowed, approved, denied by policy, refused by a budget…"""
    decision = call.decision.outcome if call.decision else None
    if call.status == "ok":
        return "approved by the approver" if decision == "require_approval" else "allowed"
    if call.status in ("failed", "timeout"):
        return f"ran and {call.status}" if call.status == "failed" else "ran and timed out"
    if call.error_type == "BudgetExceeded":
        return "refused by a budget"
    if call.error_type in ("ApprovalDenied", "ApprovalTimeout"):
        return "refused by the approver" if call.error_type == "ApprovalDenied" else "approval timed out"
    if decision == "deny":
        return "denied by policy"
    return "refused (invalid call)" if decision is None else "refused"


_OUTCOME_ORDER = ("allowed", "approved by the approver", "denied by policy", "refused by the approver",
                  "approval timed out", "refused by a budget", "refused (invalid call)", "refused",
                  "ran and failed", "ran and timed out")


def decision_counts(calls: Sequence[CallRecord]) -> dict[str, int]:
    """How many calls ended each way (see `outcome_of`), in a fixed order."""
    counts: dict[str, int] = {}
    for call in calls:
        key = outcome_of(call)
        counts[key] = counts.get(key, 0) + 1
    return {k: counts[k] for k in _OUTCOME_ORDER if k in counts}


def _budget_rows(result: RunResult, limits: Mapping[str, Mapping[str, Any]]) -> list[str]:
    rows = []
    for name, used in result.budget_usage.items():
        limit = limits.get(name, {})
        parts = []
        for key, label in (("calls", "calls"), ("cost", "cost"), ("model_tokens", "model tokens"),
                           ("model_cost_usd", "model $")):
            if limit.get(key) is not None:
                parts.append(f"{used.get(key, 0):g}/{limit[key]:g} {label}")
        if limit.get("wall_time") is not None:
            parts.append(f"{used.get('wall_time_ms', 0) / 1000:.1f}/{limit['wall_time']:g}s")
        rows.append(f"{name}: " + ", ".join(parts))
    return rows


def summary_table(result: RunResult, *, limits: Mapping[str, Mapping[str, Any]] | None = None,
                  verify: str | None = None, extra: Sequence[tuple[str, str]] = ()) -> Table:
    """The closing table: how the run ended, calls by decision, budgets, audit and trace."""
    table = Table(title="summary", box=box.ROUNDED, show_header=False, title_justify="left", expand=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")

    def row(key: str, value: str | Text) -> None:
        # Values are plain text: an answer or a path holding "[...]" must not be read as rich markup.
        table.add_row(key, value if isinstance(value, Text) else Text(_t(value, keep_newlines=True)))

    status_style = "green" if result.status == "done" else "yellow"
    row("status", Text(_t(result.status), style=status_style)
        + Text(f"  {_t(result.error)}" if result.error else "", style="dim"))
    if result.answer is not None:
        row("answer", str(result.answer))
    steps = [s for s in result.steps if s.kind == "action"]
    row("steps", f"{len(steps)} ({result.duration_ns / 1e9:.2f}s)")
    calls = result.tool_calls
    lines = [f"{n:>3}  {outcome}" for outcome, n in decision_counts(calls).items()]
    row("calls", f"{len(calls):>3}  in total\n" + "\n".join(lines) if calls else "none")
    if result.budget_usage:
        row("budgets", "\n".join(_budget_rows(result, limits or {})))
    tokens = f"{result.usage.input_tokens} tokens in, {result.usage.output_tokens} out"
    if result.cost_usd:
        tokens += f", ${result.cost_usd:.4f}"
    row("model", tokens)
    if result.sandbox is not None:
        row("sandbox", result.sandbox)
    if result.ledger is not None:
        row("ledger", result.ledger)
    row("audit log", result.audit_path or "none (no --audit)")
    if verify is not None:
        row("verify", verify)
    row("trace id", result.trace_id or "none (tracing is off)")
    for key, value in extra:
        row(key, value)
    return table


def print_run(result: RunResult, *, file: IO[str] | None = None,
              notes: Mapping[int, Sequence[str]] | None = None, extra: Sequence[tuple[str, str]] = (),
              whole: bool = False) -> None:
    """A finished run step by step, as `proctor run` showed it live, then its summary (`agent.replay()`).

    `notes[i]` are lines printed before step *i* (``notes[len(steps)]`` after the last): where a run
    read from the audit log was suspended, resumed or cut short. `extra` rows end the summary.
    `whole`: arguments in full, wrapped (`audit show --run`, `runs show`).
    """
    # A log or a report has no terminal to fit: 120 columns, unless $COLUMNS says how wide to be.
    wide = file is not None and not file.isatty() and not os.environ.get("COLUMNS", "").isdigit()
    console = Console(file=file, highlight=False, width=120 if wide else None)
    printer = StepPrinter(console, whole=whole)
    notes = notes or {}

    def say(before: int) -> None:
        for line in notes.get(before, ()):
            console.print()
            console.print(Text("» " + _t(line, keep_newlines=True), style="bold yellow"))

    for i, step in enumerate(result.steps):
        say(i)
        if step.kind == "action":
            printer.program(step)
        printer.done(step)
    say(len(result.steps))
    console.print()
    console.print(summary_table(result, extra=extra))


def when(ts_ns: int | None) -> str:
    """A record's time as ``2026-12-01 21:18:15.123Z`` (UTC), or ``-``."""
    import datetime as dt

    if not ts_ns:
        return "-"
    moment = dt.datetime.fromtimestamp(ts_ns / 1e9, tz=dt.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def print_timeline(events: Sequence[tuple[int | None, str, Sequence[str]]], *, file: IO[str] | None = None,
                   title: str = "timeline") -> None:
    """Events ``(ts_ns, what, details)`` oldest first: a line with the time and what happened, then each
    detail indented below it and wrapped at the console's width, never cut (an approver's name, a
    reason, whole arguments stay whole at any width)."""
    wide = file is not None and not file.isatty() and not os.environ.get("COLUMNS", "").isdigit()
    console = Console(file=file, highlight=False, width=120 if wide else None)
    console.print()
    console.print(Text(_t(title), style="bold"))
    from rich.padding import Padding

    for ts_ns, what, details in events:
        console.print(Text(when(ts_ns), style="dim") + Text("  ") + Text(_t(what), style="bold"), overflow="fold")
        for detail in details:  # indented, and so are the lines it wraps onto
            console.print(Padding(Text(_t(detail, keep_newlines=True), overflow="fold"), (0, 0, 0, 4)))
