"""Govern smolagents agents without rewriting them (extra ``proctor[smolagents]``).

``smolagents.CodeAgent(tools=…, model=…, executor=GovernedExecutor(gate))`` runs every
program the model writes in proctor's sandboxed interpreter: each tool call inside it is
decided by the policy, approved, audited and traced at the gate, with smolagents'
semantics for ``final_answer`` (a custom ``final_answer`` tool included), printed logs,
state across steps and ``send_variables``/``send_tools``. Errors — a refusal included —
are raised as smolagents expects, so they become observations in the agent's memory.

The agent's ``managed_agents`` (smolagents ``CodeAgent`` and ``ToolCallingAgent``, at any
depth) work inside the manager's run, as proctor's own managed agents do
(`proctor.agent.managed`): the manager's call ``researcher(task=…)`` is a governed call, and
while it runs every call the managed agent makes goes through the same gate in a view of the
same run (`RunContext.delegate`): its id, budgets, history, provenance and audit trail, with
``run.agent`` naming it and its spans nested under the manager's call. A managed ``CodeAgent``'s
programs run in a `GovernedExecutor` for the call, whatever executor it was built with (its own
`GovernedExecutor`'s policy, if another gate's, only narrows); a managed ``ToolCallingAgent``'s
tools are called through the gate. A tree proctor cannot govern whole (a managed agent running
programs in a remote executor, or one that is no smolagents agent) is refused when the agent is
built: ``CodeAgent.__init__`` asks its executor ``executor or …`` (`GovernedExecutor.__bool__`), and
``run()`` checks again before the model is asked anything.

``govern(agent, gate)`` refuses such a tree when called, and governs a ``CodeAgent`` or a
``ToolCallingAgent`` (whose tools and managed agents the model calls by JSON tool calls: each becomes
a `GovernedTool` in the agent's run) in one call.

``govern_tools(tools, gate)`` gives a ``ToolCallingAgent`` the same tools back, each call
going through the gate; such tools can be handed to a `GovernedExecutor` on the same gate too.
``mcp_client_tools(client)`` gives smolagents' ``MCPClient`` tools back with their MCP annotations.
"""

from __future__ import annotations

import dataclasses
import inspect
import keyword
import re
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from opentelemetry.context import Context
from smolagents import Tool as SmolTool
from smolagents.agent_types import handle_agent_input_types, handle_agent_output_types
from smolagents.agents import CodeAgent as SmolCodeAgent
from smolagents.agents import MultiStepAgent, ToolCallingAgent
from smolagents.default_tools import FinalAnswerTool
from smolagents.local_python_executor import CodeOutput, LocalPythonExecutor, PythonExecutor
from smolagents.memory import ActionStep, FinalAnswerStep
from smolagents.utils import AgentMaxStepsError

from proctor import adapters
from proctor.adapters import side_effect_of
from proctor.agent.managed import MAX_AGENT_DEPTH, ScopedGate, strictest_sandbox
from proctor.calls import new_id
from proctor.errors import ConfigurationError
from proctor.gate import CallScope, Gate, RunContext, agent_fields
from proctor.gate.gate import PolicyLike
from proctor.interpreter import ExecutionResult, Interpreter
from proctor.interpreter.channel import EncodeError, encode_value
from proctor.interpreter.interpreter import SandboxMode, check_installed
from proctor.narrowing import Layer, StackedLedger
from proctor.policy import Policy
from proctor.policy.reload import PolicySource
from proctor.telemetry import AgentSpan, agent_span, step_span
from proctor.telemetry.logging import get_logger
from proctor.tools import Tool, as_tool

__all__ = ["GovernedExecutor", "GovernedTool", "SmolagentsAgentTool", "MCPClientTool", "govern", "govern_tools",
           "mcp_client_tools"]

log = get_logger("proctor.integrations.smolagents")
_RESTARTED = "\nNote: the interpreter was restarted; variables and functions from earlier steps are gone.\n"
_TASK_DOC = "Long detailed description of the task."
_ARGS_DOC = ("Dictionary of extra inputs to pass to the managed agent, e.g. images, dataframes, or any other "
             "contextual data it may need.")


class _Resources:
    """What an executor holds open: its worker, its run (with the run's span) and the audit log it opened.

    Kept apart from the executor so a `weakref.finalize` can let them go at interpreter exit, when
    ``agent.cleanup()`` was never called: the run is closed in the audit trail and the log closed
    cleanly, instead of reading as a crashed writer.
    """

    def __init__(self) -> None:
        self.interpreter: Interpreter | None = None
        self.gate: Gate | None = None
        self.context: RunContext | None = None
        self.span: AgentSpan | None = None
        self.span_cm: AbstractContextManager[AgentSpan] | None = None
        self.steps = 0
        self.owned_audit: Any = None
        self.lock = threading.Lock()

    def end_run(self, status: str = "done", error: str | None = None) -> None:
        with self.lock:
            ctx, cm, span = self.context, self.span_cm, self.span
            self.context = self.span_cm = self.span = None
        if span is not None and cm is not None:
            span.finish(status, None if status == "done" else status, error)
            try:
                cm.__exit__(None, None, None)
            except Exception as exc:  # noqa: BLE001 - a span that cannot end does not keep the run open
                log.error("run_span_end_failed", error=repr(exc))
        if ctx is not None and self.gate is not None:
            fields: dict[str, Any] = {"steps": self.steps}
            if error:
                fields["error"] = ctx.scrub(error)
            self.gate.finish_run(ctx, status=status, **fields)

    def close(self, status: str = "done") -> None:
        """Let everything go; a run still open ends with `status` (``interrupted`` when the executor was
        collected, or the interpreter exited, before smolagents ended the run)."""
        if self.interpreter is not None:
            self.interpreter.close()
            self.interpreter = None
        self.end_run(status)
        if self.owned_audit is not None:
            audit, self.owned_audit = self.owned_audit, None
            audit.close()


@dataclass(frozen=True)
class _Managed:
    """How an executor runs as a managed agent's, for one call: the run's gate as the agent sees it,
    the view of the run, the agent's tool table and the span its calls nest under."""

    gate: ScopedGate
    context: RunContext
    tools: Mapping[str, Tool]
    parent: Context | None


class GovernedExecutor(PythonExecutor):  # type: ignore[misc]  # smolagents ships no type information
    """A smolagents `PythonExecutor` running every program in proctor's sandbox, every tool call through `gate`.

    `gate` is a `Gate`, or a `Policy` (or the path of a policy file, reloaded when the file changes as a
    `Gate` given a path reloads it: `policy_source`; or a `PolicySource`) to build one with `approver`
    and `audit` (an `AuditSink` or a path, opened when the agent first runs on its own: a managed
    agent's executor never opens it, its calls are in the manager's trail). `authorized_imports`
    are the modules programs may import beyond smolagents' defaults, added to the agent's own
    ``additional_authorized_imports``; `timeout` is seconds per program; `sandbox` is ``"auto"``,
    ``"bwrap"`` or ``"process"``. Other keywords go to `Interpreter`.

    Each agent run (smolagents calls `send_tools` at the start of every ``run()``) is a run at the
    gate: its own budgets and history, `principal` and `labels` in the audit trail and in CEL, an
    ``invoke_agent`` span with a span per step, a ``step`` audit record per smolagents step, and a
    ``run_finished`` record saying ``done`` or ``max_steps`` as smolagents ended it.
    """

    def __init__(self, gate: Gate | Any, *, authorized_imports: Iterable[str] = (), timeout: float = 30,
                 sandbox: SandboxMode = "auto", approver: Any = None, audit: Any = None,
                 principal: str | None = None, labels: Mapping[str, str] | None = None,
                 **interpreter_options: Any) -> None:
        self._res = _Resources()
        self._audit_spec: Any = None
        #: What the gate is built from: a Policy, or a `PolicySource` for a policy file, reloaded when it changes
        #: as a `Gate` given a path reloads it (None: a gate was given).
        self._given: Policy | PolicySource | None = None
        if isinstance(gate, Gate):
            if approver is not None or audit is not None:
                raise ConfigurationError("approver= and audit= build a gate from a policy; this gate has its own")
            self._res.gate = gate
            self.approver: Any = gate.approver
        else:
            from proctor.agent.base import policy_source

            self._given = policy_source(gate)  # a bad policy fails here, when the executor is built
            self.approver = approver
            self._audit_spec = audit
        self.authorized_imports = tuple(authorized_imports)
        self.timeout = timeout
        self.sandbox = sandbox
        self.principal, self.labels = principal, dict(labels or {})
        self.interpreter_options = interpreter_options
        #: What smolagents reads after a failed program: ``state["_print_outputs"]`` holds its logs.
        self.state: dict[str, Any] = {"_print_outputs": ""}
        #: The last program's full result: every tool call's record, isolation, whether state was lost.
        self.last_result: ExecutionResult | None = None
        self._tools: list[Tool] = []
        self._final: Tool | None = None
        self._imports: tuple[str, ...] = self.authorized_imports
        self._built_for: tuple[Any, ...] = ()
        self._pending: dict[str, Any] = {}
        self._sent: dict[str, Any] = {}
        self._managed: _Managed | None = None
        self._agent: weakref.ref[Any] | None = None
        #: The agent `govern` tied this executor to (else smolagents' ``run()`` tells, see `_calling_agent`).
        self._bound: weakref.ref[Any] | None = None
        self._step_calls: list[str] = []
        self._step_lock = threading.Lock()
        check_installed(self.authorized_imports)  # now, as smolagents' own executor checks them when built
        self._finalizer = weakref.finalize(self, self._res.close, "interrupted")

    # -- smolagents' PythonExecutor ----------------------------------------------------------------

    def send_tools(self, tools: Mapping[str, Any]) -> None:
        """Take the agent's tools (and managed agents); a changed set starts a fresh worker. Opens a gate run.

        Everything that would make the run fail is found here, before the model is asked anything:
        a tool name taken by another tool, a managed agent proctor cannot govern, a module that is
        not installed. (`govern` finds the same when the agent is built.)
        """
        agent = self._calling_agent()
        if agent is not None:
            self._adopt(agent)
            if self._managed is None and agent in _GOVERNED:
                _check_still_governed(agent, self)
        converted, final = self._convert(tools)
        self._tools, self._final = converted, final
        if self._res.interpreter is not None and self._key() != self._built_for:
            self._res.interpreter.close()  # the next program starts a worker with these tools
            self._res.interpreter = None
            self._pending = {**self._sent, **self._pending}  # which gets the variables again
        if self._managed is not None:
            return  # a managed agent works in its parent's run
        self._res.end_run()
        res = self._res
        res.steps = 0
        self._step_calls = []
        named = getattr(agent, "name", None)
        name = named if isinstance(named, str) and named else "smolagents"
        # Named after the agent (run.agent in CEL), which also keeps it from being handed its own task.
        res.context = self.gate.start_run(principal=self.principal, labels=self.labels,
                                          agent=named if isinstance(named, str) and named else None)
        model = getattr(getattr(agent, "model", None), "model_id", None)
        res.span_cm = agent_span(self.gate.tracer, agent_name=name, run=res.context.info,
                                 model=model if isinstance(model, str) else None)
        res.span = res.span_cm.__enter__()

    def _convert(self, tools: Mapping[str, Any]) -> tuple[list[Tool], Tool | None]:
        """The gate's tools for smolagents' tool table, registered at the gate (a conflict raises here), and
        the custom ``final_answer``, if any; every managed agent's tree is checked on the way."""
        converted: list[Tool] = []
        final: Tool | None = None
        for name, obj in tools.items():
            if name == "final_answer":
                final = None if _is_stock_final_answer(obj) else self._governed(name, obj)
            else:
                converted.append(self._governed(name, obj))
        if self._managed is None:
            self.gate.register(*converted, *([final] if final is not None else []))
        return converted, final

    def send_variables(self, variables: Mapping[str, Any]) -> None:
        """Make `variables` names in the program's namespace; values that are not data arrive as their repr."""
        for name, value in variables.items():
            if (not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name)
                    or name.startswith("__")):
                raise ConfigurationError(f"cannot send variable {name!r}: its name is not a plain Python identifier")
            self._pending[name] = value

    def __call__(self, code_action: str) -> CodeOutput:
        """Run one program; return its value, logs and whether it gave the final answer, or raise its error."""
        interpreter = self.interpreter
        ctx = self._context
        variables = self._variables()
        step = self._sync_step(ctx)
        if self._managed is not None or self._res.span is None:
            parent = self._managed.parent if self._managed is not None else None
            result = interpreter.run(code_action, context=ctx, parent=parent, variables=variables)
        else:
            # Under the current span: this run's, or smolagents' own step span when openinference traces it.
            with step_span(self.gate.tracer, step=step, agent_name=self._res.span.agent_name,
                           run=ctx.info if ctx else None) as span:
                result = interpreter.run(code_action, context=ctx, parent=span.context, variables=variables)
                if result.error is not None:
                    span.finish("error", type(result.error).__name__, str(result.error)[:500])
        self.last_result = result
        self._step_calls.extend(c.call_id for c in result.tool_calls)
        logs = result.logs + (_RESTARTED if result.state_lost else "")
        self.state["_print_outputs"] = logs
        if result.error is not None:
            raise result.error
        return CodeOutput(output=result.value, logs=logs, is_final_answer=result.is_final_answer)

    def cleanup(self) -> None:
        """Stop the worker and close the run (smolagents' ``agent.cleanup()`` calls this)."""
        if self._managed is not None:
            if self._res.interpreter is not None:
                self._res.interpreter.close()
                self._res.interpreter = None
            return
        self._res.close()

    # -- proctor -----------------------------------------------------------------------------------

    @property
    def policy(self) -> PolicyLike:
        """The policy deciding this executor's calls now: its gate's (a policy file's current one)."""
        if self._res.gate is not None:
            return self._res.gate.policy
        given = self._given
        assert given is not None  # (no gate given: one is built from this)
        return given.current() if isinstance(given, PolicySource) else given

    @property
    def policy_source(self) -> PolicySource | None:
        """The source reloading the policy file this executor was given (None: a Policy or a Gate)."""
        return self._given if isinstance(self._given, PolicySource) else None

    @property
    def gate(self) -> Gate:
        """The gate every call goes through (built from the policy, its audit log opened, on first use)."""
        res = self._res
        if res.gate is None:
            from proctor.backends import load_audit

            sink, _, owned = load_audit(self._audit_spec)
            res.owned_audit = sink if owned else None
            assert self._given is not None  # (a gate given is kept in `res.gate`)
            res.gate = Gate(self._given, approver=self.approver, audit=sink)
        return res.gate

    @property
    def _context(self) -> RunContext | None:
        """The run this executor's calls belong to (a managed agent's: its view of the parent's run)."""
        return self._managed.context if self._managed is not None else self._res.context

    @property
    def interpreter(self) -> Interpreter:
        """The interpreter running the programs (rebuilt when `send_tools` changes the tools)."""
        if self._res.interpreter is None:
            self._rebuild()
        assert self._res.interpreter is not None
        return self._res.interpreter

    def _calling_agent(self) -> Any:
        """The smolagents agent whose ``run()`` is calling `send_tools` on this executor, or None.

        smolagents hands its executor no reference to the agent, yet the agent decides what the run
        needs: its ``additional_authorized_imports``, its step numbers, whether it stopped at
        ``max_steps``. The caller's frame is smolagents' own ``run``; its agent is taken only when
        its executor is this one. Otherwise it is the agent this executor was attached to (`attach`),
        while this is still that agent's executor: a ``ToolCallingAgent`` `govern` took.
        """
        frame = inspect.currentframe()  # this method's; then `send_tools`; then who called it
        caller = frame.f_back.f_back if frame is not None and frame.f_back is not None else None
        candidate = caller.f_locals.get("self") if caller is not None else None
        if isinstance(candidate, SmolCodeAgent) and candidate.python_executor is self:
            return candidate
        return self._attached()

    def _attached(self) -> Any:
        bound = self._bound() if self._bound is not None else None
        return bound if bound is not None and _executor_of(bound) is self else None

    def _adopt(self, agent: Any) -> None:
        """Take what the agent says about the run: its imports, and callbacks ending steps and the run."""
        codes = isinstance(agent, SmolCodeAgent)  # a ToolCallingAgent runs no programs: it has no imports
        extra = tuple(str(m) for m in (agent.additional_authorized_imports or ())) if codes else ()
        wanted = tuple(dict.fromkeys((*self.authorized_imports, *extra)))
        if wanted != self._imports:
            check_installed(wanted)
            self._imports = wanted
        self._agent = weakref.ref(agent)
        self._hook(agent)

    def attach(self, agent: Any, *, register: bool = True) -> None:
        """Tie this executor to `agent` now, as `govern` does, and as smolagents' ``CodeAgent`` does
        itself when built with ``executor=`` this (`__bool__`): take its imports (a module that is not
        installed raises here) and check its tools and managed agents, and with `register` register
        them at the gate (a conflict, or a managed agent proctor cannot govern, raises here, when the
        agent is built)."""
        self._bound = weakref.ref(agent)
        self._adopt(agent)
        if self._res.gate is None or not register:
            # Built from a policy, its gate (and audit log) opens when its agent first runs on its own, and a
            # managed agent's never does (its calls are in its manager's trail); and an agent being built may
            # yet become a managed agent, whose tools are its own, not the gate's. The tree is checked all the same.
            for sub in _managed_of(agent).values():
                managed_agent_tool(sub, floor=self.sandbox)
            return
        self._convert({**_tools_of(agent), **_managed_of(agent)})

    def __bool__(self) -> bool:
        """True, as any object. smolagents' ``CodeAgent.__init__`` ends with ``executor or
        self.create_python_executor()``: the one moment an executor meets the agent being built, whose
        tools, managed agents and imports are all set by then. Asked there, this executor attaches to
        that agent (`attach`), so a tree with an ungoverned path, or a module that is not installed, is
        refused when the agent is built.
        (tests/integrations/test_smolagents_govern.py fails if a smolagents release stops asking.)"""
        frame = inspect.currentframe()
        caller = frame.f_back if frame is not None else None
        if caller is not None and caller.f_code is _CODE_AGENT_INIT and caller.f_locals.get("executor") is self:
            agent = caller.f_locals.get("self")
            del frame, caller  # no frame kept alive past this call
            if isinstance(agent, SmolCodeAgent):
                self.attach(agent, register=False)  # its tools are registered when it runs on its own
        return True

    def uses(self, gate: Gate) -> bool:
        """Whether this executor's calls go through `gate` (one built from a policy has no gate until it runs)."""
        return self._res.gate is gate

    def call_context(self) -> tuple[RunContext | None, Context | None, str]:
        """The run a tool call made now belongs to, the span it nests under and its call id, noted for
        the step's audit record (a governed ``ToolCallingAgent``'s calls: the agent's run, at its current
        step); no run and no span outside a run."""
        call_id = new_id("call_")
        ctx = self._context
        if ctx is None:
            return None, None, call_id
        with self._step_lock:  # a ToolCallingAgent calls tools in threads
            self._sync_step(ctx)
            self._step_calls.append(call_id)
        if self._managed is not None:
            return ctx, self._managed.parent, call_id
        span = self._res.span
        return ctx, span.context if span is not None else None, call_id

    @staticmethod
    def _hook(agent: Any) -> None:
        """Register, once per agent, the callbacks through which smolagents tells its executor a step or the run
        ended; each goes to the agent's executor of the moment, when that is a `GovernedExecutor`."""
        with _HOOK_LOCK:
            if agent in _HOOKED:
                return
            _HOOKED.add(agent)

        def on_action(step: ActionStep, agent: Any = None) -> None:
            executor = getattr(agent, "python_executor", None)
            if isinstance(executor, GovernedExecutor):
                GovernedExecutor._step_ended(executor, step)

        def on_final(step: FinalAnswerStep, agent: Any = None) -> None:
            executor = getattr(agent, "python_executor", None)
            if isinstance(executor, GovernedExecutor):
                GovernedExecutor._run_ended(executor, agent)

        agent.step_callbacks.register(ActionStep, on_action)
        agent.step_callbacks.register(FinalAnswerStep, on_final)

    def _sync_step(self, ctx: RunContext | None) -> int:
        """Move the run's step counter to the agent's (`proctor.run.step`, `per: step` budgets)."""
        if ctx is None:
            return 0
        agent = self._agent() if self._agent is not None else None
        wanted = getattr(agent, "step_number", None) if agent is not None else None
        if not isinstance(wanted, int) or wanted <= ctx.info.step:
            wanted = ctx.info.step + 1 if ctx.info.step == 0 or agent is None else ctx.info.step
        while ctx.info.step < wanted:
            ctx.next_step()
        return ctx.info.step

    def _step_ended(self, step: ActionStep) -> None:
        """Write the ``step`` audit record of a smolagents step: its number, program, calls and error."""
        ctx = self._context
        if ctx is None:
            return
        if self._managed is None:
            self._res.steps = max(self._res.steps, int(step.step_number))
        audit = self.gate.audit if self._managed is None else self._managed.gate.audit
        calls, self._step_calls = self._step_calls, []
        if audit is None:
            return
        code = step.code_action if isinstance(step.code_action, str) else None
        error = str(step.error) if step.error is not None else None
        fields: dict[str, Any] = {
            "run_id": ctx.info.id, "step": int(step.step_number), "step_kind": "action",
            "model": getattr(getattr(self._agent() if self._agent else None, "model", None), "model_id", None),
            "code": ctx.scrub(code) if code else None, "call_ids": calls,
            "error": ctx.scrub(error) if error else None, "final_answer": bool(step.is_final_answer),
        }
        fields.update(agent_fields(ctx))
        try:
            result = audit.append("step", fields, durable=False)
        except Exception as exc:  # noqa: BLE001 - sinks should not raise; a lost step record is logged
            log.error("audit_step_failed", error=repr(exc))
            return
        if not result.ok:
            log.error("audit_step_failed", error=result.error)

    def _run_ended(self, agent: Any) -> None:
        """smolagents ended the run: close it at the gate, as done or as stopped at ``max_steps``."""
        if self._managed is not None:
            return
        steps = agent.memory.steps
        last = steps[-1] if steps else None
        stopped = isinstance(getattr(last, "error", None), AgentMaxStepsError)
        self._res.end_run("max_steps" if stopped else "done")

    def _governed(self, name: str, obj: Any) -> Tool:
        """The gate's tool for `obj`: the one registered before for the same object, else a new one."""
        if self._managed is not None:
            known = self._managed.tools.get(name)
            if known is None:
                raise ConfigurationError(f"managed agent tool {name!r} appeared after the call began")
            return known
        if isinstance(obj, GovernedTool):
            if obj.gate is not self.gate:
                raise ConfigurationError(f"tool {name!r} was governed on another gate: build govern_tools() and "
                                         "GovernedExecutor on one gate, or hand the tool itself")
            return obj.tool
        existing = self.gate.tools.get(name)
        if not (isinstance(obj, Tool) or adapters.is_smolagents_tool(obj) or inspect.isroutine(obj)):
            # Anything else smolagents hands over is a managed agent (it calls them with task=…).
            if isinstance(existing, SmolagentsAgentTool) and existing.agent is obj:
                managed_agent_tool(obj, floor=self.sandbox)  # its tree may have changed since: checked again
                return existing
            return managed_agent_tool(obj, floor=self.sandbox)
        if existing is not None and existing.source is obj:
            return existing
        return as_tool(obj)

    def _key(self) -> tuple[Any, ...]:
        return (*(id(t) for t in [*self._tools, self._final]), self._imports)

    def _rebuild(self) -> None:
        gate: Any = self._managed.gate if self._managed is not None else self.gate
        self._res.interpreter = Interpreter(self._tools, gate, timeout=self.timeout, authorized_imports=self._imports,
                                            sandbox=self.sandbox, final_answer=self._final,
                                            **self.interpreter_options)
        self._built_for = self._key()
        self._sent = {}

    def _variables(self) -> dict[str, Any]:
        """The variables to set before the next program (sent with it): each as the channel carries it
        (data, dates, Decimals, numpy, pandas, PIL images), or, when it cannot cross, its repr."""
        if not self._pending:
            return {}
        out = {name: _sendable(value) for name, value in self._pending.items()}
        self._sent.update(self._pending)
        self._pending = {}
        return out

    def for_managed_call(self, managed: _Managed, imports: Iterable[str], sandbox: str) -> GovernedExecutor:
        """A copy of this executor's settings running one managed call's programs in `managed`'s run (what a
        smolagents managed agent's executor becomes while its manager's call runs it)."""
        runner: GovernedExecutor = GovernedExecutor.__new__(GovernedExecutor)  # this class's state, on a copy
        runner.__dict__.update(self.__dict__)
        runner._res = _Resources()
        runner._finalizer = weakref.finalize(runner, runner._res.close, "interrupted")
        runner._managed = managed
        runner.sandbox = sandbox  # type: ignore[assignment]  # the strictest of the chain's
        runner._imports = tuple(dict.fromkeys((*self.authorized_imports, *imports)))
        runner.state = {"_print_outputs": ""}
        runner.last_result = None
        runner._pending, runner._sent, runner._built_for = {}, {}, ()
        runner._agent, runner._step_calls = None, []
        check_installed(runner._imports)
        return runner


#: The code of smolagents' ``CodeAgent.__init__``, whose ``executor or …`` calls `GovernedExecutor.__bool__`.
_CODE_AGENT_INIT = SmolCodeAgent.__init__.__code__

#: Agents whose step callbacks tell their executor when a step and the run end (registered once each).
_HOOKED: weakref.WeakSet[Any] = weakref.WeakSet()
_HOOK_LOCK = threading.Lock()


# -- managed agents ------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class SmolagentsAgentTool(Tool):
    """A smolagents managed agent as its manager's tool ``name(task, additional_args=None)``: the gate runs
    it inside the call (`Tool.in_call`), and everything it does is governed in the manager's run."""

    agent: Any = field(repr=False, default=None)
    #: The sandbox mode of the executor above it: its programs run in no weaker one.
    floor: str = "auto"
    in_call: bool = field(repr=False, default=True)

    def run(self, args: Mapping[str, Any], timeout_s: float | None = None) -> Any:
        raise ConfigurationError(f"managed agent {self.name!r} runs only as a call through its manager's gate")

    def run_in_call(self, args: Mapping[str, Any], scope: Any) -> Any:
        assert isinstance(scope, CallScope)
        return _run_managed(self, str(args["task"]), args.get("additional_args"), scope)


def managed_agent_tool(agent: Any, *, floor: str = "auto", path: tuple[str, ...] = ()) -> SmolagentsAgentTool:
    """The tool of a smolagents managed agent, once its whole tree is known to be governable.

    Refused (`ConfigurationError`, naming the fix) when a path through it would escape the gate: an
    object that is no smolagents agent, a ``CodeAgent`` whose programs run in a remote executor
    (E2B, Docker, Modal…: its tool calls would run there, outside the gate), an agent kind other than
    ``CodeAgent`` and ``ToolCallingAgent``, or a tree deeper than `MAX_AGENT_DEPTH`.
    """
    name = getattr(agent, "name", None)
    where = " -> ".join((*path, str(name)))
    if not isinstance(agent, MultiStepAgent):
        raise ConfigurationError(f"managed agent {where} is a {type(agent).__name__}, which proctor cannot govern: "
                                 "hand over a smolagents CodeAgent or ToolCallingAgent, or make it a tool")
    if not isinstance(name, str) or not name.isidentifier():
        raise ConfigurationError(f"managed agent {where}: its name must be a Python identifier")
    if len(path) >= MAX_AGENT_DEPTH:
        raise ConfigurationError(f"managed agents nest at most {MAX_AGENT_DEPTH} deep ({where})")
    if isinstance(agent, SmolCodeAgent):
        executor = agent.python_executor
        if not isinstance(executor, (GovernedExecutor, LocalPythonExecutor)):
            raise ConfigurationError(
                f"managed agent {where} runs its programs in {type(executor).__name__}, outside proctor's gate: "
                "build it with executor=GovernedExecutor(gate) (or no executor: proctor then runs its programs)")
        floor = strictest_sandbox(floor, executor.sandbox if isinstance(executor, GovernedExecutor) else None) or floor
    elif not isinstance(agent, ToolCallingAgent):
        raise ConfigurationError(f"managed agent {where} is a {type(agent).__name__}: proctor governs smolagents "
                                 "CodeAgent and ToolCallingAgent managed agents")
    for sub in _managed_of(agent).values():
        managed_agent_tool(sub, floor=floor, path=(*path, name))
    description = str(agent.description or "").strip()
    if not description:
        raise ConfigurationError(f"managed agent {where} needs a description: CodeAgent(..., description='…')")

    def call(task: str, additional_args: dict[str, Any] | None = None) -> Any:
        raise ConfigurationError(f"managed agent {name!r} runs only as a call through its manager's gate")

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"{description}\n\nArgs:\n    task: {_TASK_DOC}\n    additional_args: {_ARGS_DOC}\n"
    built = SmolagentsAgentTool.from_function(call, name=name)  # undeclared: destructive unless the policy says
    object.__setattr__(built, "agent", agent)
    object.__setattr__(built, "floor", floor)
    return built  # type: ignore[return-value]


_BUSY: set[int] = set()
_BUSY_LOCK = threading.Lock()


def _table_of(agent: Any, floor: str) -> dict[str, Tool]:
    """The proctor tools of a managed agent's tools and managed agents (smolagents' own final_answer aside)."""
    table: dict[str, Tool] = {}
    for name, obj in _tools_of(agent).items():
        if name == "final_answer" and _is_stock_final_answer(obj):
            continue
        table[name] = obj.tool if isinstance(obj, GovernedTool) else as_tool(obj)
    for name, sub in _managed_of(agent).items():
        table[name] = managed_agent_tool(sub, floor=floor)
    return table


def _run_managed(tool: SmolagentsAgentTool, task: str, additional_args: Any, scope: CallScope) -> Any:
    """Run the managed agent on `task` inside the manager's run; its report is the call's result."""
    agent = tool.agent
    parent = scope.context
    chain = parent.agents or ((parent.info.agent,) if parent.info.agent else ())
    if agent.name in chain:
        raise ConfigurationError(f"agent {agent.name!r} is already working in this call chain "
                                 f"({' -> '.join(chain)}): an agent cannot hand a task to itself")
    with _BUSY_LOCK:
        if id(agent) in _BUSY:
            raise ConfigurationError(f"managed agent {agent.name!r} is already working on another task: a smolagents "
                                     "agent runs one task at a time")
        _BUSY.add(id(agent))
    try:
        gate = scope.gate
        table = _table_of(agent, tool.floor)
        own: Layer | None = None
        executor = _executor_of(agent)
        # (its policy asked once: a reloading one gives one policy for the whole invocation; an executor on the
        # run's own gate decides by the run's policy, whatever a reload between two asks would say)
        own_policy = executor.policy if executor is not None and not executor.uses(gate) else None
        if executor is not None and own_policy is not None and own_policy is not gate.policy:
            # Its own policy (another gate's) only narrows the run's; its budgets count its calls only.
            info = replace(parent.info, step=0, agent=agent.name)
            own = Layer(agent.name, own_policy, own_policy.new_ledger(info, gate.ledger), executor.approver)
        ledger = StackedLedger(parent.ledger, own.ledger if own is not None else None, agent=agent.name,
                               timeout_s=scope.timeout_s)
        deadline = time.monotonic() + scope.timeout_s if scope.timeout_s is not None else None
        ctx = parent.delegate(agent.name, ledger=ledger, tools=table, layer=own, parent_call_id=scope.call_id,
                              deadline=deadline)
        ledger.deadline = ctx.deadline
        ctx.sandbox_floor = tool.floor
        kwargs: dict[str, Any] = {"additional_args": additional_args} if additional_args else {}
        with agent_span(gate.tracer, agent_name=agent.name, run=ctx.info, description=agent.description,
                        model=_model_id(agent), parent=scope.parent) as span:
            managed = _Managed(ScopedGate(gate), ctx, table, span.context)
            if isinstance(agent, SmolCodeAgent):
                answer = _run_code_agent(agent, executor, managed, tool.floor, task, kwargs)
            else:
                answer = _run_tool_calling_agent(agent, gate, managed, tool.floor, task, kwargs)
            steps = agent.memory.steps
            if steps and isinstance(getattr(steps[-1], "error", None), AgentMaxStepsError):
                span.finish("max_steps", "max_steps")
        return answer
    finally:
        with _BUSY_LOCK:
            _BUSY.discard(id(agent))


def _run_code_agent(agent: Any, executor: Any, managed: _Managed, floor: str, task: str,
                    kwargs: dict[str, Any]) -> Any:
    base = executor if isinstance(executor, GovernedExecutor) else GovernedExecutor(managed.gate.policy,
                                                                                     sandbox="auto")
    runner = base.for_managed_call(managed, agent.additional_authorized_imports or (), floor)
    saved = agent.python_executor
    agent.python_executor = runner
    try:
        return agent(task, **kwargs)
    finally:
        agent.python_executor = saved
        runner.cleanup()


def _run_tool_calling_agent(agent: Any, gate: Gate, managed: _Managed, floor: str, task: str,
                            kwargs: dict[str, Any]) -> Any:
    saved_tools, saved_agents = agent.tools, agent.managed_agents
    ctx = managed.context
    agent.tools = {name: obj if name not in managed.tools else GovernedTool(managed.tools[name], gate, ctx,
                                                                            parent=managed.parent)
                   for name, obj in _tools_of(agent).items()}
    agent.managed_agents = {name: GovernedTool(managed.tools[name], gate, ctx, parent=managed.parent)
                            for name in _managed_of(agent)}
    # An agent `govern` gave its own executor: smolagents' run() would open that executor's own run.
    own = _GOVERNED.get(agent)
    runner = own.executor.for_managed_call(managed, (), floor) if own is not None else None
    if runner is not None:
        agent.python_executor = runner
    try:
        return agent(task, **kwargs)
    finally:
        agent.tools, agent.managed_agents = saved_tools, saved_agents
        if own is not None and runner is not None:
            agent.python_executor = own.executor
            runner.cleanup()


# -- govern: one call, checked when the agent is built ------------------------------------------------


@dataclass(frozen=True, eq=False)
class _Governed:
    """A ``ToolCallingAgent`` `govern` rewired: its own tools and managed agents (its tables now hold
    `GovernedTool`s) and the executor that opens a gate run at each of its ``run()``s."""

    tools: Mapping[str, Any]
    managed: Mapping[str, Any]
    executor: GovernedExecutor


_GOVERNED: weakref.WeakKeyDictionary[Any, _Governed] = weakref.WeakKeyDictionary()
_A = TypeVar("_A")


def _tools_of(agent: Any) -> Mapping[str, Any]:
    """`agent`'s own tools (a `govern`-ed ``ToolCallingAgent``'s as it was given them)."""
    own = _GOVERNED.get(agent)
    return own.tools if own is not None else agent.tools


def _managed_of(agent: Any) -> Mapping[str, Any]:
    """`agent`'s managed agents (a `govern`-ed ``ToolCallingAgent``'s as it was given them)."""
    own = _GOVERNED.get(agent)
    return own.managed if own is not None else agent.managed_agents


def _executor_of(agent: Any) -> GovernedExecutor | None:
    """The `GovernedExecutor` of `agent` at this moment: a ``CodeAgent``'s, or the one `govern` gave a
    ``ToolCallingAgent`` (replaced, while it works as a managed agent, by one in its manager's run)."""
    if not isinstance(agent, SmolCodeAgent) and agent not in _GOVERNED:
        return None
    executor = agent.python_executor
    return executor if isinstance(executor, GovernedExecutor) else None


def govern(agent: _A, gate: Gate, *, authorized_imports: Iterable[str] = (), timeout: float = 30,
           sandbox: SandboxMode = "auto", principal: str | None = None, labels: Mapping[str, str] | None = None,
           **interpreter_options: Any) -> _A:
    """Govern the smolagents `agent` — its tools and its managed agents, at any depth — through `gate`, and
    return it. Everything that would leave a path ungoverned is refused here, when the agent is built,
    with a `ConfigurationError` naming the fix.

    A ``CodeAgent`` keeps a `GovernedExecutor` it was built with on this gate (one on another gate is
    refused), gets one in place of smolagents' own local executor (the other keywords build it), and is
    refused with a remote executor (E2B, Docker, Modal…: its tool calls would run there). A
    ``ToolCallingAgent``'s tools and managed agents are replaced by `GovernedTool`s, so each call the model
    asks for passes the gate; each ``run()`` is one gate run, its managed agents working inside it. Then
    the tools are registered at the gate (two different tools of one name are refused) and the whole
    managed-agent tree is checked as `managed_agent_tool` does.
    """
    options: dict[str, Any] = {"authorized_imports": authorized_imports, "timeout": timeout, "sandbox": sandbox,
                               "principal": principal, "labels": labels, **interpreter_options}
    if isinstance(agent, SmolCodeAgent):
        label = f"agent {agent.name or 'CodeAgent'}"
        executor = agent.python_executor
        if isinstance(executor, GovernedExecutor):
            if not executor.uses(gate):
                raise ConfigurationError(f"{label} has a GovernedExecutor of another gate (or policy): build it "
                                         "without executor= (govern() gives it one on this gate), or on this gate")
        elif isinstance(executor, LocalPythonExecutor):  # smolagents' default: proctor runs its programs instead
            executor = GovernedExecutor(gate, **options)
        else:
            raise ConfigurationError(f"{label} runs its programs in {type(executor).__name__}, outside proctor's gate: "
                                     "build it without executor= or executor_type= (govern() then runs its programs)")
        executor.attach(agent)
        agent.python_executor = executor  # only once everything checked: a refused agent is left as it was
        return agent
    if isinstance(agent, ToolCallingAgent):
        _govern_tool_calling(agent, gate, options)
        return agent
    raise ConfigurationError(f"govern() takes a smolagents CodeAgent or ToolCallingAgent, not a {type(agent).__name__}")


def _check_still_governed(agent: Any, executor: GovernedExecutor) -> None:
    """Refuse a run of a `govern`-ed ``ToolCallingAgent`` given a tool or managed agent since: smolagents
    would call it directly, outside the gate."""
    for name, obj in {**agent.tools, **agent.managed_agents}.items():
        if name == "final_answer" and _is_stock_final_answer(obj):
            continue
        if not (isinstance(obj, GovernedTool) and obj.runner is executor):
            raise ConfigurationError(f"agent {agent.name or 'ToolCallingAgent'}: {name!r} was added after govern(), "
                                     "and smolagents would call it outside the gate: call govern(agent, gate) again")


def _govern_tool_calling(agent: Any, gate: Gate, options: dict[str, Any]) -> None:
    before = _GOVERNED.get(agent)
    if before is not None and not before.executor.uses(gate):
        raise ConfigurationError(f"agent {agent.name or 'ToolCallingAgent'} is governed on another gate already")

    def own(obj: Any) -> Any:  # a tool govern() wrapped before, as the agent was given it
        if before is not None and isinstance(obj, GovernedTool) and obj.runner is before.executor:
            return {**before.tools, **before.managed}.get(obj.name, obj)
        return obj

    tools = {name: own(obj) for name, obj in agent.tools.items()}
    managed = {name: own(obj) for name, obj in agent.managed_agents.items()}
    executor = before.executor if before is not None else GovernedExecutor(gate, **options)
    _GOVERNED[agent] = _Governed(tools, managed, executor)
    try:
        executor.attach(agent)  # checks the tree and registers every tool: a refusal raises here
    except BaseException:
        if before is None:
            del _GOVERNED[agent]
        else:
            _GOVERNED[agent] = before
        raise
    agent.tools = {name: obj if name == "final_answer" and _is_stock_final_answer(obj)
                   else GovernedTool(gate.tools[name], gate, runner=executor) for name, obj in tools.items()}
    agent.managed_agents = {name: GovernedTool(gate.tools[name], gate, runner=executor) for name in managed}
    # smolagents' run() calls send_tools on any agent's python_executor (a ToolCallingAgent has none): the
    # hook through which each run() opens a gate run and its step callbacks close it.
    agent.python_executor = executor


def _model_id(agent: Any) -> str | None:
    model = getattr(getattr(agent, "model", None), "model_id", None)
    return model if isinstance(model, str) else None


# -- ToolCallingAgent ----------------------------------------------------------------------------------


class GovernedTool(SmolTool):  # type: ignore[misc]  # smolagents ships no type information
    """A smolagents tool whose every call goes through a proctor gate (made by `govern_tools`)."""

    skip_forward_signature_validation = True

    def __init__(self, tool: Tool, gate: Gate, context: RunContext | None = None, *,
                 parent: Context | None = None, runner: GovernedExecutor | None = None) -> None:
        source = tool.source
        self.name = tool.name
        self.description = tool.description
        self.inputs = dict(source.inputs) if isinstance(getattr(source, "inputs", None), dict) else _inputs_of(tool)
        self.output_type = tool.output_type or "any"
        self.output_schema = getattr(source, "output_schema", None)
        self.tool, self.gate, self.context, self.parent = tool, gate, context, parent
        #: The executor whose current run the calls belong to (a `govern`-ed ``ToolCallingAgent``'s), if any.
        self.runner = runner
        super().__init__()

    def __call__(self, *args: Any, sanitize_inputs_outputs: bool = False, **kwargs: Any) -> Any:
        """smolagents' `Tool.__call__`, less its instrumentation point: with openinference on, the call's
        span is the gate's ``execute_tool`` span (nested under smolagents' step), not a second TOOL span."""
        if len(args) == 1 and not kwargs and isinstance(args[0], dict):
            (given,) = args
            if all(k in self.inputs for k in given):
                args, kwargs = (), dict(given)
        if sanitize_inputs_outputs:
            args, kwargs = handle_agent_input_types(*args, **kwargs)
        out = self.forward(*args, **kwargs)
        return handle_agent_output_types(out, self.output_type) if sanitize_inputs_outputs else out

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Call the tool through the gate: decided, approved, audited and traced; a refusal raises."""
        if self.runner is None:
            return self.gate.call(self.tool, self.tool.bind(args, kwargs), context=self.context, parent=self.parent)
        context, parent, call_id = self.runner.call_context()
        return self.gate.call(self.tool, self.tool.bind(args, kwargs), context=context, parent=parent,
                              call_id=call_id)


def govern_tools(tools: Iterable[Any], gate: Gate, *, context: RunContext | None = None) -> list[GovernedTool]:
    """The same tools back for a smolagents ``ToolCallingAgent``, each call going through `gate`.

    Takes smolagents tools, proctor tools and functions; each is registered at the gate (two
    different tools of one name are a `ConfigurationError` here). Calls belong to `context` (a run
    from ``gate.start_run()``), or to the gate's default run. The tools can also be handed to a
    `GovernedExecutor` on the same gate: its programs then call the same registered tools.
    """
    governed = []
    for obj in tools:
        if isinstance(obj, GovernedTool):
            if obj.gate is not gate:
                raise ConfigurationError(f"tool {obj.name!r} was governed on another gate")
            governed.append(obj)
            continue
        existing = gate.tools.get(getattr(obj, "name", None) or "")
        tool = existing if existing is not None and existing.source is obj else as_tool(obj)
        gate.register(tool)
        governed.append(GovernedTool(tool, gate, context))
    return governed


# -- smolagents' MCPClient -----------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class MCPClientTool(Tool):
    """A tool of smolagents' ``MCPClient`` (made by `mcp_client_tools`), with what its server said about it."""

    #: The tool's MCP annotations (``readOnlyHint``, ``destructiveHint``…) as the server sent them: hints.
    annotations: Mapping[str, Any] = field(default_factory=dict)
    #: The tool's name on its server (``get-sum``), which `name` may spell differently (``get_sum``).
    remote_name: str = ""


def mcp_client_tools(client: Any, *, name: str = "mcp", trust_annotations: bool = False) -> list[MCPClientTool]:
    """The tools of smolagents' ``MCPClient`` as proctor tools keeping their MCP annotations.

    ``client.get_tools()`` gives the tools mcpadapt made, which have lost their annotations; these are
    the same tools with them recovered (`MCPClientTool.annotations`) and read exactly as `MCPToolset`
    reads them: as hints. Each tool is ``destructive`` unless the policy's ``tools:`` section declares
    its class, or `trust_annotations` is true, which trusts *this* server: ``readOnlyHint`` → read,
    else ``destructiveHint`` (true unless false) → destructive, else ``openWorldHint`` (true unless
    false) → external, else write. `name` names the server in records and spans (``origin``
    ``mcp:<name>``). A tool that would take a Python builtin's name is refused (the MCPClient cannot
    prefix its tools: use `MCPToolset(..., prefix=…)`). Hand them to `govern_tools` for a smolagents agent.
    """
    import builtins

    from smolagents.mcp_client import MCPClient

    if not isinstance(client, MCPClient):
        raise ConfigurationError(f"mcp_client_tools() takes a smolagents MCPClient, not a {type(client).__name__}")
    made = client.get_tools()
    listed = _mcp_client_listing(client)
    if [_mcpadapt_name(spec.name) for spec in listed] != [getattr(t, "name", None) for t in made]:
        raise ConfigurationError("smolagents' MCPClient: its tools and the server's listing behind them do not line "
                                 "up (a smolagents or mcpadapt version proctor does not know): use MCPToolset")
    tools: list[MCPClientTool] = []
    for obj, spec in zip(made, listed, strict=True):
        if hasattr(builtins, obj.name) or obj.name == "final_answer":
            raise ConfigurationError(f"the MCP server {name}: tool {spec.name!r} would take the name of Python's "
                                     f"{obj.name!r}; MCPClient cannot prefix its tools: use "
                                     f"MCPToolset(..., prefix='{name}_')")
        hints = spec.annotations
        annotations: dict[str, Any] = hints.model_dump(by_alias=True, exclude_none=True) if hints is not None else {}
        side_effect = side_effect_of(annotations) if trust_annotations else "destructive"
        schema = spec.inputSchema if isinstance(spec.inputSchema, dict) else {}
        required = {str(k) for k in schema.get("required") or ()}
        base = Tool.from_parts(adapters.smolagents_parts(_MCPClientCall(obj, required)), side_effect=side_effect)
        values = {f.name: getattr(base, f.name) for f in dataclasses.fields(Tool)}
        values.update(origin=f"mcp:{name}")
        tools.append(MCPClientTool(**values, annotations=annotations, remote_name=spec.name))
    return tools


class _MCPClientCall(SmolTool):  # type: ignore[misc]  # smolagents ships no type information
    """One MCPClient tool with the inputs its server declared: mcpadapt marks every input required, so
    those the server's schema leaves optional are made nullable, and left out of the call when None."""

    skip_forward_signature_validation = True

    def __init__(self, made: Any, required: set[str]) -> None:
        self.name, self.description, self.output_type = made.name, made.description, made.output_type
        self.inputs = {k: dict(v) if k in required else {**v, "nullable": True} for k, v in made.inputs.items()}
        self.made, self.required = made, required
        super().__init__()

    def forward(self, **kwargs: Any) -> Any:
        return self.made(**{k: v for k, v in kwargs.items() if v is not None or k in self.required})


def _mcp_client_listing(client: Any) -> list[Any]:
    """The MCP tool definitions behind ``client.get_tools()``, in the same order.

    Why a private attribute: smolagents' ``MCPClient`` hands out only the tools mcpadapt made from the
    server's listing, and mcpadapt drops each definition's annotations as it makes them. The listing
    itself stays on the ``MCPAdapt`` the client keeps as ``_adapter`` (``mcp_tools``: one list per
    server, in the order ``get_tools()`` follows). This is the one place proctor reads it;
    tests/integrations/test_smolagents_mcp_client.py fails loudly when smolagents or mcpadapt change it.
    """
    try:
        from mcpadapt.core import MCPAdapt
    except ImportError as exc:  # mcpadapt imports names the mcp SDK 2.x no longer has
        raise ConfigurationError(f"smolagents' MCPClient needs mcpadapt, which does not import here ({exc}): "
                                 "use MCPToolset") from None
    adapter = client._adapter  # noqa: SLF001 - the one private read of smolagents proctor makes: see the docstring
    listing = adapter.mcp_tools if isinstance(adapter, MCPAdapt) else None
    if not isinstance(listing, list) or not all(isinstance(part, list) for part in listing):
        raise ConfigurationError("smolagents' MCPClient no longer keeps its server's listing where proctor reads it "
                                 "(a smolagents or mcpadapt version proctor does not know): use MCPToolset")
    return [spec for part in listing for spec in part]


def _mcpadapt_name(name: str) -> str:
    """The name mcpadapt gives a server's tool (its ``_sanitize_function_name``): dashes become
    underscores, other non-word characters go, a leading digit gets an underscore, a keyword one after."""
    name = re.sub(r"[^\w_]", "", name.replace("-", "_"))
    if name[:1].isdigit():
        name = f"_{name}"
    return f"{name}_" if keyword.iskeyword(name) else name


def _is_stock_final_answer(obj: Any) -> bool:
    """smolagents' own final_answer tool (it returns its argument), which proctor's final_answer matches."""
    return isinstance(obj, FinalAnswerTool) and type(obj).forward is FinalAnswerTool.forward


_JSON_TYPES = {"string", "integer", "number", "boolean", "array", "object", "null"}


def _inputs_of(tool: Tool) -> dict[str, dict[str, Any]]:
    """smolagents ``inputs`` for a proctor tool, from its JSON schema."""
    props = tool.parameters.get("properties", {})
    required = set(tool.parameters.get("required", ()))
    inputs: dict[str, dict[str, Any]] = {}
    for name, prop in props.items():
        types = [s.get("type") for s in prop.get("anyOf", [prop])]
        named = [t for t in types if t in _JSON_TYPES and t != "null"]
        entry: dict[str, Any] = {"type": named[0] if len(named) == 1 else "any",
                                 "description": tool.arg_descriptions.get(name, "")}
        if name not in required or "null" in types:
            entry["nullable"] = True
        inputs[name] = entry
    return inputs


def _sendable(value: Any) -> Any:
    """`value` when the channel carries it, else its repr (it would not survive the process boundary)."""
    try:
        encode_value(value, "variable")
        return value
    except EncodeError:
        pass
    try:
        text = repr(value)
    except Exception as exc:  # noqa: BLE001 - a broken __repr__ still sends something
        text = f"<unrepresentable {type(value).__name__}: {type(exc).__name__}>"
    log.info("variable_sent_as_repr", type=type(value).__name__)
    return text
