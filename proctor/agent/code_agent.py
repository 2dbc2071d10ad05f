"""`CodeAgent`: the model writes a Python program each step; every tool call inside it goes through the gate.

The program runs in proctor's interpreter (a sandboxed worker holding only tool
stubs), so calls made through aliases, comprehensions, ``map``, lambdas or helper
functions the model defined are each decided, approved, audited and traced on their
own; the step record lists every one of them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry.context import Context
from opentelemetry.trace import Tracer

from proctor.agent.attachments import with_images
from proctor.agent.base import AgentBase, FinalAnswerCheck, StepCallback
from proctor.agent.durable import DurableRun
from proctor.agent.models import Message, Model, ModelResponse
from proctor.agent.observations import observation
from proctor.agent.parsing import CodeParseError, extract_code
from proctor.agent.prompts import code_agent_prompt
from proctor.agent.result import StepRecord
from proctor.approval.base import Approver
from proctor.audit.base import AuditSink
from proctor.errors import SandboxError
from proctor.gate import RunContext
from proctor.interpreter.result import ProgramError
from proctor.ledger.base import SharedLedger
from proctor.policy import Policy
from proctor.policy.reload import PolicySource
from proctor.store.base import RunStore
from proctor.telemetry.logging import get_logger
from proctor.tools import Tool

if TYPE_CHECKING:
    from proctor.interpreter.interpreter import Interpreter, SandboxMode

__all__ = ["CodeAgent"]

log = get_logger("proctor.agent")

# The model must not write the observation itself; it comes from running the program.
_STOP = ("Observation:",)


class CodeAgent(AgentBase):
    """An agent that acts by writing Python, governed call by call.

    `policy` is a Policy, a path to a policy file (reloaded when the file changes, as a `Gate` given a
    path: `policy_source`) or a `PolicySource`; `audit` an AuditSink, a path
    (an `AuditLog` the agent owns) or None. `sandbox` and `timeout` (seconds per
    program) go to the interpreter; `authorized_imports` are the modules programs
    may import.
    """

    sandbox: SandboxMode

    def __init__(
        self,
        tools: Iterable[Tool | Callable[..., Any]],
        model: Model,
        policy: Policy | PolicySource | str | os.PathLike[str] | None = None,
        *,
        approver: Approver | None = None,
        audit: AuditSink | str | os.PathLike[str] | None = None,
        max_steps: int = 20,
        authorized_imports: Sequence[str] = (),
        planning_interval: int | None = None,
        final_answer_checks: Sequence[FinalAnswerCheck] = (),
        sandbox: SandboxMode = "auto",
        tracer: Tracer | None = None,
        name: str = "code_agent",
        timeout: float = 30,
        instructions: str | None = None,
        step_callbacks: Sequence[StepCallback] = (),
        program_callbacks: Sequence[StepCallback] = (),
        store: RunStore | str | os.PathLike[str] | None = None,
        audit_key: Any = None,
        ledger: SharedLedger | str | None = None,
        description: str | None = None,
        managed_agents: Sequence[AgentBase] = (),
        shadow: Policy | str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(tools, model, policy, approver=approver, audit=audit, max_steps=max_steps,
                         planning_interval=planning_interval, final_answer_checks=final_answer_checks,
                         tracer=tracer, name=name, instructions=instructions, step_callbacks=step_callbacks,
                         program_callbacks=program_callbacks, store=store, audit_key=audit_key,
                         ledger=ledger, description=description, managed_agents=managed_agents, shadow=shadow)
        self.authorized_imports = tuple(authorized_imports)
        self.sandbox = sandbox
        self.timeout = timeout
        self._interpreter: Interpreter | None = None
        if self.policy is not None and self.policy.model.sandbox == "required":
            from proctor.interpreter.sandbox import require_bwrap

            try:
                require_bwrap(sandbox)  # refused here, before any run starts: one line naming the fix
            except SandboxError:
                self.close()
                raise

    @property
    def interpreter(self) -> Interpreter:
        """The interpreter, started on first use."""
        if self._interpreter is None:
            from proctor.interpreter import Interpreter

            # A durable run re-runs programs on resume: a fixed hash seed keeps set order the same.
            gate = self._scoped_gate if self._scoped_gate is not None else self.gate  # a managed copy: the run's
            self._interpreter = Interpreter(tools=self.tools, gate=gate, timeout=self.timeout,
                                            authorized_imports=self.authorized_imports, sandbox=self.sandbox,
                                            hash_seed=0 if self.store is not None else None)
        return self._interpreter

    def sandbox_line(self) -> str:
        """"bubblewrap" or "process only (why)": the interpreter's, or what one started now would get."""
        if self._interpreter is not None:
            return self._interpreter.sandbox_line
        from proctor.interpreter.sandbox import describe_sandbox

        return describe_sandbox(self.sandbox)

    def _reset_executor(self) -> None:
        if self._interpreter is not None:
            self._interpreter.reset()

    def _fresh_executor(self) -> None:
        self._interpreter = None

    def _reset_executor_for_good(self) -> None:
        if self._interpreter is not None:
            self._interpreter.close()
            self._interpreter = None

    def close(self) -> None:
        if self._interpreter is not None:
            self._interpreter.close()
            self._interpreter = None
        super().close()

    def _rebuild(self, ctx: RunContext, durable: DurableRun, steps: Sequence[StepRecord]) -> None:
        """Re-run the earlier steps' programs in the fresh worker, their calls answered from their journals,
        so the variables and functions they defined exist again for the step being resumed."""
        for step in steps:
            if step.kind != "action" or step.code is None:
                continue
            ctx.journal = durable.replay_journal(step.number)
            try:
                result = self.interpreter.run(step.code, context=ctx, seed=ctx.journal.seed)
            finally:
                journal, ctx.journal = ctx.journal, None
                journal.flush()
            if journal.diverged is not None or result.state_lost:
                log.warning("namespace_rebuild_incomplete", run_id=ctx.info.id, step=step.number,
                            error=str(journal.diverged or result.error))
                self._reset_executor()

    def _system_prompt(self) -> str:
        return code_agent_prompt(self.tools, self.prompt_policy(), self.authorized_imports, self.instructions)

    def _ask(self, messages: Sequence[Message]) -> ModelResponse:
        return self.model.generate(messages, stop=_STOP)

    def _act(self, step: StepRecord, response: ModelResponse, ctx: RunContext, parent: Context) -> tuple[bool, Any]:
        self.memory.append({"role": "assistant", "content": response.content})
        try:
            code = extract_code(response.content)
        except CodeParseError as exc:
            step.error = "parse error: no code block"
            step.observation = str(exc)
            self._announce(step)
            self.memory.append({"role": "user", "content": "Observation:\n" + step.observation})
            return False, None
        step.code = code
        self._announce(step)
        journal = ctx.journal
        interpreter = self.interpreter
        if ctx.deadline is not None:  # a managed agent: no program runs past the time its parent's call gave it
            interpreter.timeout = max(0.05, min(self.timeout, ctx.deadline - time.monotonic()))
        interpreter.result_hook = self.images.take  # a tool's image reaches the program as a handle, not bytes
        try:
            result = interpreter.run(code, context=ctx, parent=parent,
                                     seed=journal.seed if journal is not None else None)
        finally:
            interpreter.result_hook = None
        images, described = self.images.drain()
        step.images += described
        step.tool_calls = list(result.tool_calls)
        error = _error_text(result.error)
        if error:
            step.error = error
        step.final_answer = bool(result.is_final_answer) and not error
        step.observation = observation(logs=result.logs or "", value=result.value,
                                       has_value=not result.is_final_answer, calls=step.tool_calls, error=error)
        if result.state_lost:
            # The worker was replaced (timeout or crash): say so, or the model will use names that are gone.
            step.observation += ("\n\nNote: the interpreter was restarted; variables and functions from earlier "
                                 "programs are gone.")
        if images:
            step.observation += (f"\n\n{len(images)} image(s) returned by tool calls are attached below, in the "
                                 "order of their handles.")
        self.memory.append({"role": "user", "content": with_images("Observation:\n" + step.observation, images)})
        return step.final_answer, result.value if step.final_answer else None


def _error_text(error: Any) -> str | None:
    """The interpreter's error as text (it may give a string or an exception)."""
    if error is None or error == "":
        return None
    if isinstance(error, ProgramError):
        return str(error)  # already "ZeroDivisionError: division by zero (line 3)"
    if isinstance(error, BaseException):
        return f"{type(error).__name__}: {error}"
    return str(error)
