"""proctor: every tool call an agent's code makes, stopped at one gate before it runs."""

from __future__ import annotations

from proctor.agent import (
    CodeAgent,
    LiteLLMModel,
    ModelResponse,
    RunResult,
    ScriptedModel,
    StepRecord,
    ToolCallingAgent,
)
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
    StoreError,
    ToolDenied,
    ToolFailed,
)
from proctor.gate import CallOutcome, Gate, RunContext
from proctor.interpreter import ExecutionResult, Interpreter
from proctor.policy import Policy
from proctor.store import RunStore
from proctor.tools import Tool, tool

__all__ = [
    "ApprovalDenied",
    "ApprovalTimeout",
    "AuditCorrupted",
    "AuditError",
    "AuditLog",
    "BudgetExceeded",
    "CallOutcome",
    "CallRecord",
    "CallRefused",
    "CallbackApprover",
    "CodeAgent",
    "ConsoleApprover",
    "Decision",
    "ExecutionResult",
    "ExecutionTimeout",
    "Gate",
    "Interpreter",
    "LiteLLMModel",
    "ModelResponse",
    "Policy",
    "PolicyError",
    "ProctorError",
    "RunContext",
    "RunInfo",
    "RunResult",
    "RunStore",
    "SandboxError",
    "ScriptedModel",
    "StepRecord",
    "StoreError",
    "Tool",
    "ToolCallingAgent",
    "ToolDenied",
    "ToolFailed",
    "WebhookApprover",
    "tool",
]

__version__ = "0.1.0"
