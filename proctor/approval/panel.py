"""The rich panel the console approver shows for one request.

Everything shown comes from the request, which may carry text the model wrote.
It is never parsed as rich markup; control, format and invisible characters (ANSI
escapes, bidi overrides, U+3164, U+034F, ...) are shown as escapes in reverse red,
and characters that can pass for others (a Cyrillic ``\\u0435`` in ``bob@\\u0435xample.com``, a
fullwidth letter, a no-break space) are highlighted with their code point, with a
warning row naming each (`proctor.termsafe`), so an argument cannot repaint the
prompt, hide part of itself or pass for another value.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from proctor.approval.base import ApprovalRequest
from proctor.termsafe import look_alikes, marked_text, terminal_safe

__all__ = ["KEYS_HELP", "format_duration", "render_request", "safe_text"]

KEYS_HELP = "[a]pprove  [d]eny  [e]dit  [g]rant"

_SIDE_EFFECT_STYLE = {
    "none": "green",
    "read": "green",
    "write": "yellow",
    "external": "bold magenta",
    "destructive": "bold red",
}


def safe_text(value: str, *, keep_newlines: bool = False) -> str:
    """`value` escaped for the terminal: `proctor.termsafe.terminal_safe` (kept under this name)."""
    return terminal_safe(value, keep_newlines=keep_newlines)


def _json(value: Any, *, indent: int | None = None) -> str:
    # default=repr: the panel must show *something* for a value JSON cannot hold.
    return json.dumps(value, indent=indent, sort_keys=True, ensure_ascii=False, default=repr)


def format_duration(seconds: float) -> str:
    """``1h02m``, ``4m05s``, ``9.5s``: short and exact enough for a countdown."""
    if seconds < 60:
        return f"{max(seconds, 0.0):.1f}s" if seconds < 10 else f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _budget_text(budget: Mapping[str, Any]) -> Text:
    if not budget:
        return Text("(no budget applies)", style="dim")
    lines = [f"{safe_text(str(name))}: {safe_text(_json(value))}" for name, value in budget.items()]
    return Text("\n".join(lines))


def _expiry_text(expires_at_ns: int, now_ns: int, limit: float | None) -> Text:
    left = (expires_at_ns - now_ns) / 1e9
    at = datetime.fromtimestamp(expires_at_ns / 1e9, tz=timezone.utc).strftime("%H:%M:%S UTC")
    text = f"in {format_duration(left)} (at {at})" if left > 0 else "already expired"
    if limit is not None and limit < left:
        text += f"; this console waits {format_duration(limit)}"
    return Text(text)


def _look_alike_warning(*texts: str) -> Text | None:
    """One line per distinct invisible or confusable character in what the panel shows."""
    seen: dict[str, str] = {}
    for text in texts:
        for mark in look_alikes(text):
            seen.setdefault(mark.char, f"{mark.kind}: {mark.label}")
    if not seen:
        return None
    lines = [f"{line} ({terminal_safe(ch) if ch.isprintable() else 'shown as an escape'})"
             for ch, line in seen.items()]
    return Text("\n".join(lines), style="bold yellow")


def render_request(request: ApprovalRequest, *, wait_limit: float | None = None, now_ns: int | None = None) -> Panel:
    """The panel for `request`; `wait_limit` is the console's own timeout when shorter than the expiry."""
    now = time.time_ns() if now_ns is None else now_ns
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    side_effect = str(request.side_effect)
    grid.add_row("tool", marked_text(request.tool, style="bold cyan"))
    grid.add_row("side effect", Text(safe_text(side_effect), style=_SIDE_EFFECT_STYLE.get(side_effect, "bold red")))
    args = _json(dict(request.args), indent=2) if request.args else "{}"
    grid.add_row("arguments", marked_text(args, keep_newlines=True))
    warning = _look_alike_warning(request.tool, args, request.run.principal or "",
                                  *(f"{k}={v}" for k, v in request.run.labels.items()))
    if warning is not None:
        grid.add_row("⚠ look-alikes", warning)
    grid.add_row("rules", Text(safe_text(", ".join(request.rules)) if request.rules else "(none)"))
    grid.add_row("reason", Text(safe_text(request.reason) if request.reason else "(none given)"))
    grid.add_row("budget left", _budget_text(request.budget))
    grid.add_row("policy", Text(f"sha256 {safe_text(request.policy_sha256[:12])}"))
    grid.add_row("expires", _expiry_text(request.expires_at_ns, now, wait_limit))
    run = request.run
    who = f"{safe_text(run.principal)} · " if run.principal else ""
    labels = " ".join(f"{safe_text(str(k))}={safe_text(str(v))}" for k, v in run.labels.items())
    grid.add_row("run", Text(f"{who}{safe_text(run.id)} step {run.step}" + (f" · {labels}" if labels else "")))
    grid.add_row("call", Text(safe_text(request.call_id), style="dim"))
    return Panel(
        Group(grid),
        title=Text(f"approval needed: {safe_text(request.tool)}", style="bold"),
        subtitle=Text(KEYS_HELP),
        border_style="yellow",
        expand=False,
    )
