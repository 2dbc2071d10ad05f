"""What the model is shown after a step: output, each call with its decision and status, errors.

Kept compact and bounded: a program that prints megabytes must not blow the
model's context, so logs and values are cut with a note saying so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from proctor.calls import CallRecord

__all__ = ["MAX_LOG_CHARS", "describe_call", "format_args", "observation", "truncate"]

MAX_LOG_CHARS = 8000
MAX_VALUE_CHARS = 2000


def truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n… [{len(text) - limit} more characters cut]"


def _shown(value: Any) -> str:
    if isinstance(value, Mapping) and set(value) == {"$redacted"}:
        return "<redacted>"  # the policy redacts this argument; its keyed digest is in the audit log
    return repr(value)


def format_args(args: Mapping[str, Any], limit: int = 120) -> str:
    """``a='x', n=2`` — the call's arguments as the model would write them (redacted ones show as redacted)."""
    text = ", ".join(f"{k}={_shown(v)}" for k, v in args.items())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe_call(i: int, call: CallRecord) -> str:
    """One line: ``2. refund(order_id='A-2', amount=240.0) -> deny [large-refunds]: denied: …``."""
    decision = call.decision.outcome if call.decision else "refused"
    rules = f" [{', '.join(call.decision.rules)}]" if call.decision and call.decision.rules else ""
    line = f"{i}. {call.tool}({format_args(call.args)}) -> {decision}{rules}, {call.status}"
    if call.approval:
        line += f" (approval: {call.approval})"
    if call.error:
        line += f": {call.error_type or 'error'}: {call.error}"
    return line


def observation(
    *,
    logs: str = "",
    value: Any = None,
    has_value: bool = False,
    calls: Sequence[CallRecord] = (),
    error: str | None = None,
) -> str:
    """The observation text for one step."""
    parts: list[str] = []
    if logs.strip():
        parts.append("Execution logs:\n" + truncate(logs.rstrip(), MAX_LOG_CHARS))
    if calls:
        parts.append(f"Tool calls ({len(calls)}):\n" + "\n".join(describe_call(i, c) for i, c in enumerate(calls, 1)))
    if has_value and value is not None:
        parts.append("Last output: " + truncate(repr(value), MAX_VALUE_CHARS))
    if error:
        parts.append("Error: " + truncate(error, MAX_VALUE_CHARS))
    if not parts:
        parts.append("The program ran and printed nothing.")
    return "\n\n".join(parts)
