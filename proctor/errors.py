"""Every error proctor raises, in one tree.

```
ProctorError                      base of everything below
├── CallRefused                   a tool call that did not run (visible to generated code)
│   ├── ToolDenied                the policy said deny, or the arguments were invalid
│   ├── ApprovalDenied            a human (or approval channel) said no, or the channel failed
│   │   └── ApprovalTimeout       nobody answered before the approval expired
│   └── BudgetExceeded            the call would pass a budget limit
│       └── LedgerUnavailable     the shared budget ledger (Redis) could not be reached: fail closed
├── ToolFailed                    the tool ran and raised; carries the tool's message
│   └── ToolOutcomeUnknown        the tool started and its result is lost (timed out, its server died)
├── PolicyError                   a policy file that cannot be loaded (file, line, column)
├── AuditError                    the audit trail could not be written: the call is refused
│   └── AuditCorrupted            an existing log is damaged and will not be appended to
├── ExecutionTimeout              a program ran past its time limit and was killed
├── SandboxError                  the worker could not start, misbehaved, or died
├── StepInterrupted               the host stopped the step's program (it never sees this)
│   ├── RunSuspended              a call waits for an answer that comes later: the run suspends
│   └── ReplayDiverged            a resumed program asked for other calls than its journal holds
├── StoreError                    the run store could not be opened, read or written
│   ├── RunNotFound               no run with that id in the store
│   ├── ApprovalNotFound          no approval with that id in the store
│   ├── StoreConflict             someone else changed the record first (or holds the run)
│   ├── StoreForged               what the store holds for a run was not sealed by the run (resume refused)
│   ├── ApprovalConflict          an answer with the wrong binding, or to an approval already closed
│   │   ├── FourEyes              the approver is the principal of the run that asks
│   │   └── ApprovalExpired       an answer after the approval's deadline (the policy's approval.timeout)
│   └── InvalidAnswer (ValueError)  an answer the store cannot take (bad verdict, edited args the tool refuses)
├── ToolsetError                  a tool server (MCP) could not be started, reached or listed
├── ManagedAgentError             a managed agent ended without a final answer (its parent's call fails)
├── ToolDefinitionError (TypeError)   an object cannot become a tool as written
├── ModelError (RuntimeError)         the model could not answer
└── ConfigurationError (ValueError, TypeError)   an argument or setting proctor cannot use
    └── ImageError                an image proctor will not pass to a model (unreadable, format, size)
```

The three last keep a builtin base (in parentheses) so code that catches the builtin
keeps working.

The first five are the ones a model sees inside its program, at the call site of
the tool; `ApprovalDenied`, `ApprovalTimeout` and `BudgetExceeded` are refusals too,
so `except CallRefused` catches every call that did not run.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ApprovalConflict",
    "ApprovalDenied",
    "ApprovalExpired",
    "ApprovalNotFound",
    "ApprovalTimeout",
    "AuditCorrupted",
    "AuditError",
    "BudgetExceeded",
    "CallRefused",
    "ConfigurationError",
    "ExecutionTimeout",
    "FourEyes",
    "ImageError",
    "InvalidAnswer",
    "LedgerUnavailable",
    "ManagedAgentError",
    "ModelError",
    "PolicyError",
    "PolicyIssue",
    "ProctorError",
    "RunNotFound",
    "ReplayDiverged",
    "RunSuspended",
    "SandboxError",
    "StepInterrupted",
    "StoreConflict",
    "StoreForged",
    "StoreError",
    "ToolDefinitionError",
    "ToolDenied",
    "ToolFailed",
    "ToolOutcomeUnknown",
    "ToolsetError",
]


class ProctorError(Exception):
    """Base class of every error proctor raises."""


class CallRefused(ProctorError):
    """A tool call was refused before it ran; the tool was not executed."""

    def __init__(self, message: str, *, tool: str = "", call_id: str = "", rules: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.tool = tool
        self.call_id = call_id
        self.rules = rules


class ToolDenied(CallRefused):
    """The policy denied the call, or its arguments did not fit the tool's schema."""


class ApprovalDenied(CallRefused):
    """Approval was required and not given (refused, or the channel failed)."""


class ApprovalTimeout(ApprovalDenied):
    """Approval was required and nobody answered in time."""


class BudgetExceeded(CallRefused):
    """Running the call would pass a budget limit, so it was refused before anyone was asked."""

    def __init__(
        self,
        message: str,
        *,
        tool: str = "",
        call_id: str = "",
        rules: tuple[str, ...] = (),
        budget: str = "",
    ) -> None:
        super().__init__(message, tool=tool, call_id=call_id, rules=rules)
        self.budget = budget


class LedgerUnavailable(BudgetExceeded):
    """The shared budget ledger could not be reached or answered too late, so the call was refused.

    Nothing was reserved that will not expire on its own (a lease); the next call tries again.
    """


class ToolFailed(ProctorError):
    """The tool ran and raised; the message is the tool's own."""

    def __init__(self, message: str, *, tool: str = "", call_id: str = "", error_type: str = "") -> None:
        super().__init__(message)
        self.tool = tool
        self.call_id = call_id
        self.error_type = error_type


class ToolOutcomeUnknown(ToolFailed):
    """The tool started and whether it took effect is not known: it timed out, or the server running
    it went away during the call. A tool raises it instead of `TimeoutError` when it cannot tell that
    nothing happened (an MCP call, which a cancellation may or may not have stopped in time)."""


@dataclass(frozen=True)
class PolicyIssue:
    """One problem found in a policy file, located as precisely as the source allows."""

    file: str
    line: int
    column: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.message}"


class PolicyError(ProctorError):
    """A policy could not be loaded; `issues` lists every problem found, each located.

    `file`, `line` and `column` are those of the first issue (1-based).
    """

    def __init__(self, issues: list[PolicyIssue] | PolicyIssue | str) -> None:
        if isinstance(issues, str):
            issues = [PolicyIssue("<policy>", 1, 1, issues)]
        elif isinstance(issues, PolicyIssue):
            issues = [issues]
        if not issues:
            raise ValueError("PolicyError needs at least one issue")
        self.issues = list(issues)
        first = self.issues[0]
        self.file, self.line, self.column = first.file, first.line, first.column
        super().__init__("\n".join(str(i) for i in self.issues))


class AuditError(ProctorError):
    """The audit trail could not record something; a call that needed it did not run."""


class AuditCorrupted(AuditError):
    """An existing audit log is damaged beyond a torn last line; it is not appended to."""

    def __init__(
        self, message: str, *, seq: int | None = None, line: int | None = None, offset: int | None = None
    ) -> None:
        super().__init__(message)
        self.seq = seq
        self.line = line
        self.offset = offset


class ExecutionTimeout(ProctorError):
    """A program ran past its time limit; its worker was killed and its state lost."""


class SandboxError(ProctorError):
    """The sandboxed worker could not start, broke the channel protocol, or died."""


class StoreError(ProctorError):
    """The run store could not be opened, read or written."""


class RunNotFound(StoreError):
    """No run with that id in the store."""


class ApprovalNotFound(StoreError):
    """No approval with that id in the store."""


class StoreConflict(StoreError):
    """Someone else changed the record first, or another process holds the run."""


class StoreForged(StoreError):
    """What the store holds for a run was not written by the run's own processes: a seal does not hold
    (`proctor.store.seal`). A resume refuses it (`resume_refused` in the audit log) and runs nothing."""


class ApprovalConflict(StoreError):
    """The answer's binding is not the approval's, or the approval was already answered or voided."""


class ApprovalExpired(ApprovalConflict):
    """The approval's deadline (the policy's `approval.timeout` from when it was asked) has passed: no answer
    is taken any more, and the call ends as the policy's `on_timeout` says."""


class FourEyes(ApprovalConflict):
    """Nobody answers a call of a run they are the principal of."""


class InvalidAnswer(StoreError, ValueError):
    """An answer that cannot be taken as given: an unknown verdict, a deny without a reason, edited
    arguments the tool's schema refuses, a grant pattern that is not safe."""


class ToolsetError(ProctorError):
    """A tool server (an MCP server) could not be started, reached or listed; its tools are not available."""


class ManagedAgentError(ProctorError):
    """A managed agent ended without a final answer (max_steps, a budget, an error); its parent's call
    to it fails with this message, which says how the agent ended."""


class ToolDefinitionError(ProctorError, TypeError):
    """An object cannot become a tool as written (raised when it is declared or registered)."""


class ModelError(ProctorError, RuntimeError):
    """The model could not answer; the message is one line naming the model and the cause."""


class ConfigurationError(ProctorError, ValueError, TypeError):
    """An argument or setting proctor cannot use; the message says which and what it accepts.

    Both a ValueError and a TypeError, as the builtin checks it replaces were one or the other.
    """


class ImageError(ConfigurationError):
    """An image proctor will not pass to a model: unreadable, of another format, or over a size limit."""


class StepInterrupted(ProctorError):
    """The host stopped the step's program at a call: its worker is torn down, nothing after it runs."""

    def __init__(self, message: str, *, tool: str = "", call_id: str = "") -> None:
        super().__init__(message)
        self.tool = tool
        self.call_id = call_id


class RunSuspended(StepInterrupted):
    """A call needs an answer that has not come yet: the run is saved and resumed later (`agent.resume`)."""

    def __init__(self, message: str, *, tool: str = "", call_id: str = "", approval_id: str = "") -> None:
        super().__init__(message, tool=tool, call_id=call_id)
        self.approval_id = approval_id


class ReplayDiverged(StepInterrupted):
    """A resumed step's program asked for another call than the one its journal recorded at that point."""
