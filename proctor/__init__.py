"""proctor: every tool call an agent's code makes, stopped at one gate before it runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

import proctor._lazy as _lazy

if TYPE_CHECKING:
    from proctor.agent import (
        CodeAgent,
        LiteLLMModel,
        ModelResponse,
        RunResult,
        ScriptedModel,
        StepRecord,
        ToolCallingAgent,
    )
    from proctor.approval import CallbackApprover, ConsoleApprover, InboxApprover, WebhookApprover
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
    "InboxApprover",
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

_lazy.install(__name__, {
    "CodeAgent": "proctor.agent",
    "LiteLLMModel": "proctor.agent",
    "ModelResponse": "proctor.agent",
    "RunResult": "proctor.agent",
    "ScriptedModel": "proctor.agent",
    "StepRecord": "proctor.agent",
    "ToolCallingAgent": "proctor.agent",
    "CallbackApprover": "proctor.approval",
    "ConsoleApprover": "proctor.approval",
    "InboxApprover": "proctor.approval",
    "WebhookApprover": "proctor.approval",
    "AuditLog": "proctor.audit",
    "CallRecord": "proctor.calls",
    "Decision": "proctor.calls",
    "RunInfo": "proctor.calls",
    "ApprovalDenied": "proctor.errors",
    "ApprovalTimeout": "proctor.errors",
    "AuditCorrupted": "proctor.errors",
    "AuditError": "proctor.errors",
    "BudgetExceeded": "proctor.errors",
    "CallRefused": "proctor.errors",
    "ExecutionTimeout": "proctor.errors",
    "PolicyError": "proctor.errors",
    "ProctorError": "proctor.errors",
    "SandboxError": "proctor.errors",
    "StoreError": "proctor.errors",
    "ToolDenied": "proctor.errors",
    "ToolFailed": "proctor.errors",
    "CallOutcome": "proctor.gate",
    "Gate": "proctor.gate",
    "RunContext": "proctor.gate",
    "ExecutionResult": "proctor.interpreter",
    "Interpreter": "proctor.interpreter",
    "Policy": "proctor.policy",
    "RunStore": "proctor.store",
    "Tool": "proctor.tools",
    "tool": "proctor.tools",
})
