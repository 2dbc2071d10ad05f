"""What `Interpreter.run` returns: the program's value, output, error and every tool call."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proctor.calls import CallRecord
from proctor.errors import ProgramError

__all__ = ["ExecutionResult", "ProgramError"]


@dataclass(frozen=True)
class ExecutionResult:
    """What one program did: its last expression's value, output, error and every tool call, in order.

    `state_lost` is true when the worker had to be replaced (timeout, crash, protocol
    violation) — on the result that lost it and on the first result of the fresh worker.
    `isolation` is ``"bwrap"`` or ``"process"``; `duration` the wall time of `run` in seconds.
    """

    value: Any
    logs: str
    error: Exception | None
    tool_calls: Sequence[CallRecord] = ()
    is_final_answer: bool = False
    state_lost: bool = False
    isolation: str = ""
    duration: float = 0.0
