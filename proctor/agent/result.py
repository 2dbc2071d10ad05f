"""What a run returns: the answer, how it ended, and every step with every call."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from proctor.agent.models import Usage
from proctor.calls import CallRecord

__all__ = ["RUN_STATUSES", "RunResult", "RunStatus", "StepKind", "StepRecord"]

#: `interrupted`: Ctrl-C or SIGTERM in the host; it is recorded in the audit trail, and the
#: interrupt is raised again, so `run()` never returns a result with this status.
#: `suspended` / `cancelled`: a durable run (an agent with a store) waiting for approvals, or ended from outside.
RunStatus = Literal["done", "max_steps", "budget_exhausted", "error", "interrupted", "suspended", "cancelled"]
RUN_STATUSES: tuple[RunStatus, ...] = ("done", "max_steps", "budget_exhausted", "error", "interrupted", "suspended",
                                       "cancelled")
StepKind = Literal["action", "planning"]


@dataclass
class StepRecord:
    """One step: what the model wrote, the program it ran, what it observed, and each call the program made.

    `number` is the action step (1-based); a planning step carries the number of the
    action step it precedes. `code` is None when the answer held no program (or for
    the tool-calling agent, whose calls are in `tool_calls`).
    """

    number: int
    kind: StepKind = "action"
    model_output: str = ""
    code: str | None = None
    observation: str = ""
    tool_calls: list[CallRecord] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    cost_usd: float | None = None
    error: str | None = None
    duration_ns: int = 0
    final_answer: bool = False
    #: Images the step brought into the run (the task's, or tools' results): descriptions, never bytes.
    images: list[dict[str, Any]] = field(default_factory=list)

    @property
    def thought(self) -> str:
        """What the model wrote before its program (its "Thought:"); for a planning step, the plan."""
        text = self.model_output
        for marker in ("```", "<code>"):
            if marker in text:
                text = text.split(marker, 1)[0]
        return text.strip()

    def as_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "kind": self.kind,
            "model_output": self.model_output,
            "code": self.code,
            "observation": self.observation,
            "tool_calls": [c.as_dict() for c in self.tool_calls],
            "usage": self.usage.as_dict(),
            "cost_usd": self.cost_usd,
            "error": self.error,
            "duration_ns": self.duration_ns,
            "final_answer": self.final_answer,
            "images": [dict(i) for i in self.images],
        }


@dataclass
class RunResult:
    """How a run ended. `status` is ``done``, ``max_steps``, ``budget_exhausted`` or ``error``; or, for a run
    with a store, ``suspended`` (waiting for the approvals in `pending`; `agent.resume(run_id)` goes on) or
    ``cancelled``."""

    answer: Any
    status: RunStatus
    steps: list[StepRecord]
    usage: Usage
    cost_usd: float | None
    run_id: str
    audit_path: str | None = None
    trace_id: str | None = None
    error: str | None = None
    duration_ns: int = 0
    #: What each budget of the policy used in this run (`Ledger.usage()`), and what is left.
    budget_usage: dict[str, dict[str, Any]] = field(default_factory=dict)
    budget_remaining: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: What a suspended run waits for (`proctor.store.PendingApproval`s).
    pending: list[Any] = field(default_factory=list)
    #: How the run's programs were isolated: "bubblewrap", "process only (why)", or, for an agent that runs
    #: no program (`ToolCallingAgent`), a sentence saying so; None where nobody knows (a run read from a log).
    sandbox: str | None = None
    #: Where the policy's cross-run budgets were counted (`LedgerScope.summary`); None without such budgets.
    ledger: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "done"

    @property
    def tool_calls(self) -> list[CallRecord]:
        """Every call of the run, in order."""
        return [c for s in self.steps for c in s.tool_calls]

    def calls_by_status(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for c in self.tool_calls:
            counts[c.status] = counts.get(c.status, 0) + 1
        return counts

    def as_dict(self) -> dict[str, Any]:
        return {
            "answer": self.answer,
            "status": self.status,
            "run_id": self.run_id,
            "steps": [s.as_dict() for s in self.steps],
            "usage": self.usage.as_dict(),
            "cost_usd": self.cost_usd,
            "audit_path": self.audit_path,
            "trace_id": self.trace_id,
            "error": self.error,
            "duration_ns": self.duration_ns,
            "budget_usage": self.budget_usage,
            "budget_remaining": self.budget_remaining,
            "pending": [p.as_dict() if hasattr(p, "as_dict") else p for p in self.pending],
            "sandbox": self.sandbox,
            "ledger": self.ledger,
        }
