"""What the host accepts from a worker, checked field by field before anything acts on it.

A worker may be fully compromised (``authorized_imports=["*"]`` makes that easy), so
every frame is validated here; anything off-shape is a `ProtocolError`, which makes
the host kill the worker. A well-formed ``call`` is only ever a *request*: the gate
decides it exactly as it would decide the same call from a stub.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from proctor.calls import CallPosition, CallRecord
from proctor.errors import BudgetExceeded, CallRefused, ProctorError, ToolFailed
from proctor.interpreter.channel import ProtocolError, decode_value

__all__ = ["CallRequest", "Done", "Final", "Ready", "error_payload", "parse_worker_message"]

_FIELDS: dict[str, frozenset[str]] = {
    "ready": frozenset({"t", "pid"}),
    "call": frozenset({"t", "id", "run", "tool", "args"}),
    "call_at": frozenset({"t", "id", "run", "tool", "at", "args"}),  # a call with where the program made it
    "final": frozenset({"t", "run", "value"}),
    "done": frozenset({"t", "run", "value", "error", "final", "cut", "key"}),
}


@dataclass(frozen=True)
class Ready:
    pid: int


class CallRequest(NamedTuple):  # a tuple: made once per tool call, and a frozen dataclass costs 3x as much
    id: int
    run: int
    tool: str
    args: dict[str, Any]
    #: Where the program made the call, as the worker says (not yet checked against the program).
    at: CallPosition | None = None
    #: Bytes of the frame's ``"at":"…",`` (0 without): the frame's envelope, beside its arguments.
    at_bytes: int = 0


@dataclass(frozen=True)
class Final:
    run: int
    value: Any


@dataclass(frozen=True)
class Done:
    run: int
    value: Any
    error: dict[str, Any] | None
    final: bool
    cut: bool
    key: Any = None


_KINDS = frozenset({"ready", "call", "final", "done"})
_MAX_INT = 2**62


def _int(message: Mapping[str, Any], key: str) -> int:
    value = message.get(key)
    if type(value) is not int or value < 0 or value > _MAX_INT:
        raise ProtocolError(f"field {key!r} must be a non-negative integer, got {type(value).__name__}")
    return value



def parse_worker_message(message: Mapping[str, Any], max_depth: int = 0) -> Ready | CallRequest | Final | Done:
    """The typed form of one worker message, or `ProtocolError` saying what is wrong with it.

    Values nested deeper than `max_depth` (default `channel.MAX_DEPTH`) are refused as they are decoded.
    """
    kind = message.get("t")
    if not isinstance(kind, str) or kind not in _KINDS:
        raise ProtocolError(f"unexpected message type {kind!r} from the worker")
    fields = _FIELDS["call_at"] if kind == "call" and "at" in message else _FIELDS[kind]
    if message.keys() != fields:
        extra, missing = set(message) - fields, fields - set(message)
        raise ProtocolError(f"{kind} message with unexpected fields {sorted(extra)} / missing {sorted(missing)}")
    if kind == "ready":
        return Ready(_int(message, "pid"))
    run = _int(message, "run")
    if kind == "call":
        tool, args = message["tool"], decode_value(message["args"], 0, max_depth)
        if not isinstance(tool, str) or not tool.isidentifier() or len(tool) > 200:
            raise ProtocolError("call message with a tool name that is not an identifier")
        if not isinstance(args, dict) or not all(isinstance(k, str) for k in args):
            raise ProtocolError("call message whose args are not a mapping of names")
        if "at" not in message:
            return CallRequest(_int(message, "id"), run, tool, args)
        text = message["at"]
        at = CallPosition.parse(text) if isinstance(text, str) else None
        if at is None:
            raise ProtocolError(f"call message with a malformed position {str(text)[:40]!r}")
        return CallRequest(_int(message, "id"), run, tool, args, at, len(text) + 8)
    value = decode_value(message["value"], 0, max_depth)
    if kind == "final":
        return Final(run, value)
    error, final, cut = message["error"], message["final"], message["cut"]
    if type(final) is not bool or type(cut) is not bool:
        raise ProtocolError("done message with non-boolean flags")
    if error is not None:
        if (not isinstance(error, dict) or set(error) != {"type", "message", "line"}
                or not isinstance(error["type"], str) or not isinstance(error["message"], str)
                or not (error["line"] is None or type(error["line"]) is int)):
            raise ProtocolError("done message with a malformed error")
    return Done(run, value, error, final, cut, message["key"])


def error_payload(error: ProctorError) -> dict[str, Any]:
    """How a gate error travels to the worker, which raises the same-named class at the call site."""
    out: dict[str, Any] = {"type": type(error).__name__, "message": str(error)}
    if isinstance(error, (CallRefused, ToolFailed)):
        out["tool"], out["call_id"] = error.tool, error.call_id
    if isinstance(error, CallRefused):
        out["rules"] = list(error.rules)
    if isinstance(error, BudgetExceeded):
        out["budget"] = error.budget
    if isinstance(error, ToolFailed):
        out["error_type"] = error.error_type
    return out


def refused_record(call_id: str, tool: str, message: str) -> CallRecord:
    """The record of a request refused before the gate (unknown tool, after final_answer)."""
    return CallRecord(call_id, tool, {}, "destructive", None, "denied", 0, message, "ToolDenied")
