"""What `Interpreter.run` returns: the program's value, output, error and every tool call."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proctor.calls import CallRecord
from proctor.errors import ProctorError

__all__ = ["ExecutionResult", "ProgramError"]


class ProgramError(ProctorError):
    """The program raised: its exception type, message, line and that line's source text,
    as ``ZeroDivisionError: division by zero (line 3: y = x / 0)``."""

    def __init__(self, type_name: str, message: str, line: int | None, source: str | None = None) -> None:
        self.type, self.message, self.line, self.source = type_name, message, line, source
        where = (f" (line {line}: {source})" if source else f" (line {line})") if line else ""
        head, newline, rest = message.partition("\n")  # a SyntaxError's source line and caret go below
        text = f"{type_name}: {head}{where}" if head else f"{type_name}{where}"
        super().__init__(text + newline + rest)


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
