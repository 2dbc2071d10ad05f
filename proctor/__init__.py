"""proctor: every tool call an agent's code makes, stopped at one gate before it runs."""

from __future__ import annotations

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
from proctor.tools import Tool, tool

__all__ = [
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
