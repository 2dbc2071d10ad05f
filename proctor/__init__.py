"""proctor: every tool call an agent's code makes, stopped at one gate before it runs."""

from __future__ import annotations

from proctor.approval import CallbackApprover, ConsoleApprover, WebhookApprover
from proctor.audit import AuditLog
from proctor.calls import CallRecord, Decision, RunInfo
from proctor.errors import (
    ApprovalDenied,
    ApprovalTimeout,
    AuditCorrupted,
    AuditError,
    BudgetExceeded,
    CallRefused,
    ExecutionTimeout,
    PolicyError,
    ProctorError,
    SandboxError,
    ToolDenied,
    ToolFailed,
)
from proctor.gate import CallOutcome, Gate, RunContext
from proctor.policy import Policy
from proctor.tools import Tool, tool

__all__ = [
    "AuditLog",
    "CallOutcome",
    "CallRecord",
    "CallbackApprover",
    "ConsoleApprover",
    "Decision",
    "Gate",
    "Policy",
    "RunContext",
    "RunInfo",
    "WebhookApprover",
    "ApprovalDenied",
    "ApprovalTimeout",
    "AuditCorrupted",
    "AuditError",
    "BudgetExceeded",
    "CallRefused",
    "ExecutionTimeout",
    "PolicyError",
    "ProctorError",
    "SandboxError",
    "Tool",
    "ToolDenied",
    "ToolFailed",
    "tool",
]

__version__ = "0.1.0"
