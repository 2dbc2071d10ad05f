"""Tools for the durable-run tests: each real call appends a line to a counter file on the host.

`$DURABLE_COUNTER` names the file; `$DURABLE_CRASH` makes a tool SIGKILL its own process
(`before:BODY` before its effect, `after:BODY` after it), to crash a run mid-step.
"""

from __future__ import annotations

import json
import os
import signal

from proctor.tools import tool

__all__ = ["TOOLS", "count", "look", "note", "send"]


def _crash(point: str) -> None:
    if os.environ.get("DURABLE_CRASH") == point:
        os.kill(os.getpid(), signal.SIGKILL)


def _effect(tool_name: str, **args: object) -> None:
    with open(os.environ["DURABLE_COUNTER"], "a", encoding="utf-8") as f:
        f.write(json.dumps([tool_name, args], sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


@tool(side_effect="read")
def look(x: int) -> int:
    """Read a number.

    Args:
        x: Which one.
    """
    _effect("look", x=x)
    return x * 10


@tool(side_effect="external")
def send(to: str, body: str) -> str:
    """Send a message.

    Args:
        to: Recipient.
        body: Text.
    """
    _crash(f"before:{body}")
    _effect("send", to=to, body=body)
    _crash(f"after:{body}")
    return f"sent {body} to {to}"


@tool(side_effect="write")
def note(text: str) -> str:
    """Write a note (the policy may declare it idempotent).

    Args:
        text: The note.
    """
    _crash(f"before:{text}")
    _effect("note", text=text)
    _crash(f"after:{text}")
    return f"noted {text}"


TOOLS = [look, send, note]


def count(path: str) -> list[list[object]]:
    """Every real call made so far, in order: [tool, args]."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
