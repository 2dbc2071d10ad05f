"""Govern smolagents agents without rewriting them (extra ``proctor[smolagents]``).

``smolagents.CodeAgent(tools=…, model=…, executor=GovernedExecutor(gate))`` runs every
program the model writes in proctor's sandboxed interpreter: each tool call inside it is
decided by the policy, approved, audited and traced at the gate, with smolagents'
semantics for ``final_answer`` (a custom ``final_answer`` tool included), printed logs,
state across steps and ``send_variables``/``send_tools``. Errors — a refusal included —
are raised as smolagents expects, so they become observations in the agent's memory.

``govern_tools(tools, gate)`` gives a ``ToolCallingAgent`` the same tools back, each call
going through the gate.
"""

from __future__ import annotations

import keyword
import math
from collections.abc import Iterable, Mapping
from typing import Any

from smolagents import Tool as SmolTool
from smolagents.default_tools import FinalAnswerTool
from smolagents.local_python_executor import CodeOutput, PythonExecutor

from proctor import adapters
from proctor.errors import ConfigurationError
from proctor.gate import Gate, RunContext
from proctor.interpreter import ExecutionResult, Interpreter
from proctor.interpreter.interpreter import SandboxMode, check_installed
from proctor.telemetry.logging import get_logger
from proctor.tools import Tool, as_tool

__all__ = ["GovernedExecutor", "GovernedTool", "govern_tools"]

log = get_logger("proctor.integrations.smolagents")
_RESTARTED = "\nNote: the interpreter was restarted; variables and functions from earlier steps are gone.\n"


class GovernedExecutor(PythonExecutor):  # type: ignore[misc]  # smolagents ships no type information
    """A smolagents `PythonExecutor` running every program in proctor's sandbox, every tool call through `gate`.

    `gate` is a `Gate`, or a `Policy` (or the path of a policy file) to build one with `approver`
    and `audit` (an `AuditSink` or a path). `authorized_imports` are the modules programs may
    import beyond smolagents' defaults (give the agent the same list as
    ``additional_authorized_imports`` so its prompt says so); `timeout` is seconds per program;
    `sandbox` is ``"auto"``, ``"bwrap"`` or ``"process"``. Other keywords go to `Interpreter`.

    Each agent run (smolagents calls `send_tools` at the start of every ``run()``) is a run at the
    gate: its own budgets and history, `principal` and `labels` in the audit trail and in CEL.
    """

    def __init__(self, gate: Gate | Any, *, authorized_imports: Iterable[str] = (), timeout: float = 30,
                 sandbox: SandboxMode = "auto", approver: Any = None, audit: Any = None,
                 principal: str | None = None, labels: Mapping[str, str] | None = None,
                 **interpreter_options: Any) -> None:
        self._owned_audit: Any = None
        if not isinstance(gate, Gate):
            from proctor.agent.base import load_audit, load_policy

            sink, _, owned = load_audit(audit)
            self._owned_audit = sink if owned else None
            gate = Gate(load_policy(gate), approver=approver, audit=sink)
        elif approver is not None or audit is not None:
            raise ConfigurationError("approver= and audit= build a gate from a policy; this gate has its own")
        self.gate = gate
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
        self._interpreter: Interpreter | None = None
        self._built_for: tuple[int, ...] = ()
        self._context: RunContext | None = None
        self._pending: dict[str, Any] = {}
        self._sent: dict[str, Any] = {}
        check_installed(self.authorized_imports)  # now, as smolagents' own executor checks them when built

    # -- smolagents' PythonExecutor ----------------------------------------------------------------

    def send_tools(self, tools: Mapping[str, Any]) -> None:
        """Take the agent's tools (and managed agents); a changed set starts a fresh worker. Opens a gate run."""
        converted: list[Tool] = []
        final: Tool | None = None
        for name, obj in tools.items():
            if name == "final_answer":
                final = None if _is_stock_final_answer(obj) else self._governed(obj)
            else:
                converted.append(self._governed(obj))
        self._tools, self._final = converted, final
        if self._interpreter is not None and self._key() != self._built_for:
            self._interpreter.close()  # the next program starts a worker with these tools
            self._interpreter = None
            self._pending = {**self._sent, **self._pending}  # which gets the variables again
        if self._context is not None:
            self.gate.finish_run(self._context)
        self._context = self.gate.start_run(principal=self.principal, labels=self.labels)

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
        self._apply_variables(interpreter)
        result = self.last_result = interpreter.run(code_action, context=self._context)
        logs = result.logs + (_RESTARTED if result.state_lost else "")
        self.state["_print_outputs"] = logs
        if result.error is not None:
            raise result.error
        return CodeOutput(output=result.value, logs=logs, is_final_answer=result.is_final_answer)

    def cleanup(self) -> None:
        """Stop the worker and close the run (smolagents' ``agent.cleanup()`` calls this)."""
        if self._interpreter is not None:
            self._interpreter.close()
            self._interpreter = None
        if self._context is not None:
            self.gate.finish_run(self._context)
            self._context = None
        if self._owned_audit is not None:
            close = getattr(self._owned_audit, "close", None)
            if close is not None:
                close()
            self._owned_audit = None

    # -- proctor -----------------------------------------------------------------------------------

    @property
    def interpreter(self) -> Interpreter:
        """The interpreter running the programs (rebuilt when `send_tools` changes the tools)."""
        if self._interpreter is None:
            self._rebuild()
        assert self._interpreter is not None
        return self._interpreter

    def _governed(self, obj: Any) -> Tool:
        """The gate's tool for `obj`: the one registered before for the same object, else a new one."""
        existing = self.gate.tools.get(getattr(obj, "name", None) or "")
        if existing is not None and existing.source is obj and obj is not None:
            return existing
        if isinstance(obj, Tool) or adapters.is_smolagents_tool(obj) or not isinstance(getattr(obj, "inputs", None),
                                                                                      dict):
            return as_tool(obj)
        return adapters.from_smolagents(obj)  # a managed agent: name, description, inputs, output_type

    def _key(self) -> tuple[int, ...]:
        return tuple(id(t) for t in [*self._tools, self._final])

    def _rebuild(self) -> None:
        self._interpreter = Interpreter(self._tools, self.gate, timeout=self.timeout,
                                        authorized_imports=self.authorized_imports, sandbox=self.sandbox,
                                        final_answer=self._final, **self.interpreter_options)
        self._built_for = self._key()
        self._sent = {}

    def _apply_variables(self, interpreter: Interpreter) -> None:
        if not self._pending:
            return
        lines = [f"{name} = {_literal(value)}" for name, value in self._pending.items()]
        result = interpreter.run("\n".join(lines) + "\nNone", context=self._context)
        if result.error is not None:
            raise ConfigurationError(f"the agent's variables could not be sent to the sandbox: {result.error}")
        self._sent.update(self._pending)
        self._pending = {}


class GovernedTool(SmolTool):  # type: ignore[misc]  # smolagents ships no type information
    """A smolagents tool whose every call goes through a proctor gate (made by `govern_tools`)."""

    skip_forward_signature_validation = True

    def __init__(self, tool: Tool, gate: Gate, context: RunContext | None = None) -> None:
        source = tool.source
        self.name = tool.name
        self.description = tool.description
        self.inputs = dict(source.inputs) if isinstance(getattr(source, "inputs", None), dict) else _inputs_of(tool)
        self.output_type = tool.output_type or "any"
        self.output_schema = getattr(source, "output_schema", None)
        self.tool, self.gate, self.context = tool, gate, context
        super().__init__()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Call the tool through the gate: decided, approved, audited and traced; a refusal raises."""
        return self.gate.call(self.tool, self.tool.bind(args, kwargs), context=self.context)


def govern_tools(tools: Iterable[Any], gate: Gate, *, context: RunContext | None = None) -> list[GovernedTool]:
    """The same tools back for a smolagents ``ToolCallingAgent``, each call going through `gate`.

    Takes smolagents tools, proctor tools and functions; each is registered at the gate. Calls
    belong to `context` (a run from ``gate.start_run()``), or to the gate's default run.
    """
    governed = []
    for obj in tools:
        existing = gate.tools.get(getattr(obj, "name", None) or "")
        tool = existing if existing is not None and existing.source is obj else as_tool(obj)
        gate.register(tool)
        governed.append(GovernedTool(tool, gate, context))
    return governed


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


def _literal(value: Any, depth: int = 0) -> str:
    """Python source rebuilding `value` when it is data; otherwise its repr, as a string."""
    kind = type(value)
    if value is None or kind in (bool, int, str, bytes):
        return repr(value)
    if kind is float:
        return repr(value) if math.isfinite(value) else f"float({str(value)!r})"
    if depth < 50:
        if kind is list:
            return "[" + ", ".join(_literal(v, depth + 1) for v in value) + "]"
        if kind is tuple:
            return "(" + "".join(_literal(v, depth + 1) + ", " for v in value) + ")"
        if kind in (set, frozenset):
            items = "[" + ", ".join(_literal(v, depth + 1) for v in value) + "]"
            return f"{kind.__name__}({items})"
        if kind is dict:
            pairs = (f"{_literal(k, depth + 1)}: {_literal(v, depth + 1)}" for k, v in value.items())
            return "{" + ", ".join(pairs) + "}"
    try:
        text = repr(value)
    except Exception as exc:  # noqa: BLE001 - a broken __repr__ still sends something
        text = f"<unrepresentable {kind.__name__}: {type(exc).__name__}>"
    log.info("variable_sent_as_repr", type=kind.__name__)
    return repr(text)
