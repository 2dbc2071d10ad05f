"""A call in flight through the gate, and what the gate hands back for it.

`InFlight` holds one call's state as it walks the gate's steps (`proctor.gate.gate`) and
everything they learn; the recorder (`proctor.gate.recorder`) writes its records and ends
its span, the journal (`proctor.gate.journal`) reads it to replay a resumed step. Nothing
outside this package makes or keeps one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry.context import Context

from proctor.approval.base import Grant
from proctor.calls import BudgetHold, CallPosition, CallRecord, CallStatus, Decision, SideEffect
from proctor.errors import ProctorError
from proctor.narrowing import Layer
from proctor.policy.engine import ToolFacts
from proctor.redaction import Redacted
from proctor.telemetry.spans import ToolSpan
from proctor.tools import Tool

if TYPE_CHECKING:
    from proctor.gate.gate import Gate, PolicyLike
    from proctor.gate.journal import StepJournal
    from proctor.gate.run import RunContext
    from proctor.gate.shadow import PendingDecision

__all__ = ["UNKNOWN_FACTS", "Approval", "CallOutcome", "CallScope", "InFlight", "agent_fields"]


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """What `Gate.submit` returns: the call's record, and its value or the error it raised."""

    record: CallRecord
    value: Any = None
    error: ProctorError | None = None

    def unwrap(self) -> Any:
        """The value, or raise the error."""
        if self.error is not None:
            raise self.error
        return self.value


@dataclass(frozen=True, slots=True)
class CallScope:
    """What the gate hands a tool that makes governed calls of its own (a managed agent, `Tool.in_call`):
    the gate, the run and the call it runs in, the call's span (its children nest under it) and the
    policy's timeout for it (the tool must keep to it itself: it is not run in a thread that could be
    abandoned while it still makes calls)."""

    gate: Gate
    context: RunContext
    call_id: str
    parent: Context | None
    timeout_s: float | None


@dataclass
class Approval:
    """How an approval went, for the audit record and the span."""

    verdict: str
    approver: str
    reason: str = ""
    wait_ns: int = 0
    grant: Grant | None = None
    args: Mapping[str, Any] | None = None
    #: Where the answer came from (the inbox's client address, ``cli:HOST``…), for the call's record.
    address: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "approver": self.approver,
            "reason": self.reason,
            "wait_ns": self.wait_ns,
            "grant": self.grant.as_dict() if self.grant else None,
        }


def _no_tool() -> None:
    """Stands in for the tool of a call that names none the gate knows; never run."""


#: The facts of a tool the gate does not know (or could not look up): the worst case.
UNKNOWN_FACTS = ToolFacts("destructive", 0, None, (), "fsync")
_NO_TOOL = Tool.from_function(_no_tool)


class InFlight:
    """A call in flight: its state (see `Gate`'s steps) and everything the steps learn. One per call;
    its tool and facts are the unknown worst case until admission looks them up."""

    __slots__ = ("approval", "args", "call_id", "cost", "ctx", "decision", "duration_ns", "error", "facts",
                 "journal", "layer_facts", "layer_votes", "name", "on_result", "policy", "policy_sha256", "position",
                 "redacted",
                 "reservation", "seq", "shadow", "side_effect", "span", "started_ns", "state",
                 "status", "tool", "value")

    def __init__(self, name: str, call_id: str, ctx: RunContext, span: ToolSpan, *, started_ns: int,
                 policy: PolicyLike, on_result: Callable[[Any, ProctorError | None], None] | None = None,
                 journal: StepJournal | None = None, seq: int = -1, position: CallPosition | None = None) -> None:
        self.name = name
        #: Where the program made the call (the interpreter's report, checked against the program).
        self.position = position
        self.call_id = call_id
        self.ctx = ctx
        self.span = span
        self.on_result = on_result
        #: The policy that decides the call, whole (a reload while it is in flight does not change it).
        self.policy = policy
        self.policy_sha256 = policy.sha256
        self.args: dict[str, Any] = {}
        #: A durable run's journal of the step and the call's number in it (-1: none).
        self.journal = journal
        self.seq = seq
        self.started_ns = started_ns
        #: The last step reached: new -> validated -> decided -> reserved -> approving -> authorized
        #: -> intent -> running -> ran -> done.
        self.state = "new"
        self.tool: Tool = _NO_TOOL
        self.facts: ToolFacts = UNKNOWN_FACTS
        self.side_effect: SideEffect = "destructive"
        self.decision: Decision | None = None
        self.cost = 0.0
        self.redacted: Redacted | None = None
        self.approval: Approval | None = None
        #: What the run's ledger gave for the call's budgets (handed back to it to settle or release).
        self.reservation: BudgetHold | None = None
        self.value: Any = None
        self.error: ProctorError | None = None
        self.status: CallStatus = "ok"
        self.duration_ns = 0
        # Set (and read) only for a managed agent's call (ctx.layers): each layer's facts of the tool, and the
        # (layer, decision) pairs (the run policy's first, layer None).
        self.layer_facts: list[ToolFacts] = []
        self.layer_votes: list[tuple[Layer | None, Decision]] = []
        #: The shadow policy's decision of the call, still to make or made (`proctor.gate.shadow`).
        self.shadow: PendingDecision | None = None


def agent_fields(ctx: RunContext) -> dict[str, Any]:
    """The fields naming a managed agent in the audit records of its calls ({} for the run's own agent)."""
    if ctx.parent_call_id is None:
        return {}
    return {"agent": ctx.info.agent, "parent_call_id": ctx.parent_call_id}
