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
│   ├── ToolOutcomeUnknown        the tool started and its result is lost (timed out, its server died)
│   └── MCPToolFailed             an MCP server answered the call with an error (isError)
├── PolicyError                   a policy file that cannot be loaded (file, line, column)
├── ConditionError                a CEL condition that does not compile (line, column in the expression)
├── EvaluationError               a condition that cannot be evaluated for one call (the call is denied)
├── AggregateError (ValueError)   a history pipeline whose value is an error
├── ValueTooDeep (ValueError)     a value too deep or cyclic for a condition to see
├── Unresolved (LookupError)      a probe's path that does not resolve plainly: CEL evaluates it as written
├── SimulationError (ValueError)  inputs `policy test`/`explain` cannot decide as the gate would
├── AuditError                    the audit trail could not be written: the call is refused
│   └── AuditCorrupted            an existing log is damaged and will not be appended to
├── LineError                     one audit line is not a well-formed record (PARSE, NONCANONICAL)
├── ScanFailure                   a scan of an audit log stopped at its first bad record
├── ExecutionTimeout              a program ran past its time limit and was killed
├── SandboxError                  the worker could not start, misbehaved, or died
├── ProgramError                  the program raised (type, message, line and its source)
├── InterpreterError              the program did something the interpreter refuses
├── EncodeError (TypeError)       a value the worker channel cannot carry
├── ProtocolError (ValueError)    a frame or value that breaks the worker channel's protocol
├── WorkerDied                    the worker's channel closed: it exited or was killed
├── StepInterrupted               the host stopped the step's program (it never sees this)
│   ├── RunSuspended              a call waits for an answer that comes later: the run suspends
│   └── ReplayDiverged            a resumed program asked for other calls than its journal holds
├── StoreError                    the run store could not be opened, read or written
│   ├── RunNotFound               no run with that id in the store
│   ├── ApprovalNotFound          no approval with that id in the store
│   ├── StoreConflict             someone else changed the record first (or holds the run)
│   │   └── RunTakenOver          another process took the run over from this one (its lease ran out)
│   ├── StoreForged               what the store holds for a run was not sealed by the run (resume refused)
│   ├── ApprovalConflict          an answer with the wrong binding, or to an approval already closed
│   │   ├── FourEyes              the approver is the principal of the run that asks
│   │   └── ApprovalExpired       an answer after the approval's deadline (the policy's approval.timeout)
│   ├── InvalidAnswer (ValueError)  an answer the store cannot take (bad verdict, edited args the tool refuses)
│   ├── AmbiguousId               an id prefix that names more than one id
│   └── RunCancelled              the run was cancelled in the store while this process worked on it
├── HaltError                     a halt could not be set, lifted or listed
├── HaltRefused                   a halt or lift from the inbox that cannot be taken (carries the HTTP status)
├── SignatureError (ValueError)   a webhook message's signature is missing, malformed, wrong or too old
├── ToolLoadError (ValueError)    a `--tools MOD:ATTR` spec that names nothing usable
├── CodeParseError (ValueError)   a model's answer that holds no program
├── ToolsetError                  a tool server (MCP) could not be started, reached or listed
├── ManagedAgentError             a managed agent ended without a final answer (its parent's call fails)
├── ToolDefinitionError (TypeError)   an object cannot become a tool as written
├── ModelError (RuntimeError)         the model could not answer
└── ConfigurationError (ValueError, TypeError)   an argument or setting proctor cannot use
    └── ImageError                an image proctor will not pass to a model (unreadable, format, size)

FinalAnswer (BaseException)       a program's `final_answer(...)`: a signal, not an error
Terminated (SystemExit)           a terminating signal (SIGTERM, SIGHUP): exits with 128 + its number
```

Those with a builtin base (in parentheses) keep it so code that catches the builtin keeps
working. The two signals below the tree are not errors: they derive from BaseException on
purpose, so that no `except Exception` (in a program, or in an application) swallows them.

The first five are the ones a model sees inside its program, at the call site of
the tool; `ApprovalDenied`, `ApprovalTimeout` and `BudgetExceeded` are refusals too,
so `except CallRefused` catches every call that did not run.
"""

from __future__ import annotations

from dataclasses import dataclass

# typing is not imported at run time: the sandboxed worker imports this module at start-up.
TYPE_CHECKING = False
if TYPE_CHECKING:  # only for an annotation: the audit scanner imports this module, not the reverse
    from proctor.audit.scan import Failure

__all__ = [
    "AggregateError",
    "AmbiguousId",
    "ApprovalConflict",
    "ApprovalDenied",
    "ApprovalExpired",
    "ApprovalNotFound",
    "ApprovalTimeout",
    "AuditCorrupted",
    "AuditError",
    "BudgetExceeded",
    "CallRefused",
    "CodeParseError",
    "ConditionError",
    "ConfigurationError",
    "EncodeError",
    "EvaluationError",
    "ExecutionTimeout",
    "FinalAnswer",
    "FourEyes",
    "HaltError",
    "HaltRefused",
    "ImageError",
    "InterpreterError",
    "InvalidAnswer",
    "LedgerUnavailable",
    "LineError",
    "MCPToolFailed",
    "ManagedAgentError",
    "ModelError",
    "PolicyError",
    "PolicyIssue",
    "ProctorError",
    "ProgramError",
    "ProtocolError",
    "ReplayDiverged",
    "RunCancelled",
    "RunNotFound",
    "RunSuspended",
    "RunTakenOver",
    "SandboxError",
    "ScanFailure",
    "SignatureError",
    "SimulationError",
    "StepInterrupted",
    "StoreConflict",
    "StoreError",
    "StoreForged",
    "Terminated",
    "ToolDefinitionError",
    "ToolDenied",
    "ToolFailed",
    "ToolLoadError",
    "ToolOutcomeUnknown",
    "ToolsetError",
    "Unresolved",
    "ValueTooDeep",
    "WorkerDied",
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


class MCPToolFailed(ToolFailed):
    """The MCP server answered the call with an error (``isError``); the gate records the call as failed."""


class RunCancelled(StoreError):
    """The run was cancelled in the store while this process worked on it."""


class RunTakenOver(StoreConflict):
    """Another process took the run over from this one, whose claim's lease ran out while it still worked on
    it (a call that outlasted the lease): this one writes nothing more of the run and runs none of its calls."""


class AmbiguousId(StoreError):
    """A prefix that names more than one id."""


class HaltError(ProctorError):
    """A halt could not be set, lifted or listed (a bad halt, an unreachable backend): says which and why."""


class HaltRefused(ProctorError):
    """A halt from the inbox that cannot be taken: `status` is the HTTP status, the message says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class SignatureError(ProctorError, ValueError):
    """A message's signature is missing, malformed, wrong or too old; `str()` says which."""


class ToolLoadError(ProctorError, ValueError):
    """A ``--tools`` spec that names nothing usable; the message says what to fix."""


class CodeParseError(ProctorError, ValueError):
    """The answer holds no program; the message says what was expected."""


# -- the policy's conditions (CEL) ------------------------------------------------------------------


class ConditionError(ProctorError):
    """A condition that does not compile; `line`/`column` are 1-based, inside the expression (0: all of it).

    The loader turns it into a located `PolicyError`; `proctor policy explain` prints it."""

    def __init__(self, message: str, line: int = 1, column: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column


class EvaluationError(ProctorError):
    """A condition that could not be evaluated for one call (the call is then denied)."""


class AggregateError(ProctorError, ValueError):
    """A pipeline whose value is an error (CEL's message for the entry that caused it)."""


class ValueTooDeep(ProctorError, ValueError):
    """A value CEL's converter must not see: cyclic, nested too deep, or with too many containers."""


class Unresolved(ProctorError, LookupError):
    """A probe's path does not resolve plainly for this call: evaluate the condition as written."""


class SimulationError(ProctorError, ValueError):
    """The inputs cannot be decided as the gate would (a history entry the tool would have refused).

    `history_index` is the position of the offending history entry, when one is.
    """

    def __init__(self, message: str, history_index: int | None = None) -> None:
        super().__init__(message)
        self.history_index = history_index


# -- the audit log's lines ----------------------------------------------------------------------------


class LineError(ProctorError):
    """One line is not a well-formed record; `code` is PARSE or NONCANONICAL."""

    def __init__(self, code: str, message: str, *, unreadable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        #: True when the line is not JSON at all (what a crash mid-append leaves behind).
        self.unreadable = unreadable


class ScanFailure(ProctorError):
    """A scan of an audit log stopped at its first bad record; `failure` locates it (seq, line, offset)."""

    def __init__(self, failure: Failure, *, unreadable: bool = False) -> None:
        super().__init__(failure.message)
        self.failure = failure
        self.unreadable = unreadable


# -- the interpreter: program, channel and worker ----------------------------------------------------


class ProgramError(ProctorError):
    """The program raised: its exception type, message, line and that line's source text,
    as ``ZeroDivisionError: division by zero (line 3: y = x / 0)``."""

    def __init__(self, type_name: str, message: str, line: int | None, source: str | None = None) -> None:
        self.type, self.message, self.line, self.source = type_name, message, line, source
        where = (f" (line {line}: {source})" if source else f" (line {line})") if line else ""
        head, newline, rest = message.partition("\n")  # a SyntaxError's source line and caret go below
        text = f"{type_name}: {head}{where}" if head else f"{type_name}{where}"
        super().__init__(text + newline + rest)


class InterpreterError(ProctorError):
    """The program did something the interpreter refuses (a forbidden name, import or builtin)."""


class EncodeError(ProctorError, TypeError):
    """A value cannot be carried over the channel (names the offending type and where)."""


class ProtocolError(ProctorError, ValueError):
    """A frame or value broke the protocol: bad length, bad JSON, bad tag, too deep."""


class WorkerDied(ProctorError):
    """The worker's channel closed: it exited or was killed."""


# -- signals: BaseExceptions on purpose, so no `except Exception` swallows them -------------------------


class FinalAnswer(BaseException):
    """Raised by `final_answer`; a BaseException so `except Exception` cannot swallow it."""


class Terminated(SystemExit):
    """A terminating signal (SIGTERM, SIGHUP) raised as an exception; exits with 128 + the signal number."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum
