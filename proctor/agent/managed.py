"""Managed agents: an agent handed to another as ``managed_agents=[…]`` is one of its tools.

```python
researcher = CodeAgent(tools=[search], model=model, policy="researcher.yaml",
                       name="researcher", description="Finds facts on the web and reports them.")
manager = CodeAgent(tools=[send_email], model=model, policy="policy.yaml", managed_agents=[researcher])
manager.run("Find out X and mail it to bob")   # its programs call researcher(task="…")
```

The parent's call ``researcher(task=…)`` goes through the gate like any call: a tool named
after the agent, destructive unless the policy's ``tools:`` says otherwise. When it runs,
the managed agent works *inside the parent's run* (`proctor.gate.run.AgentContext`): its calls go
through the same gate with the run's id, history and budgets, `run.agent` naming it, its own
policy (if any) only narrowing (`proctor.narrowing`), and its spans under the parent's
``execute_tool researcher`` span. Its final answer is the call's result; a run that ends
without one is the call's error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from proctor.errors import ConfigurationError, ProctorError
from proctor.tools import Tool

if TYPE_CHECKING:
    from collections.abc import Callable

    from opentelemetry.context import Context

    from proctor.calls import CallPosition, JSONValue
    from proctor.gate.call import CallOutcome
    from proctor.gate.gate import Gate, PolicyLike
    from proctor.gate.run import RunContext

__all__ = ["MAX_AGENT_DEPTH", "AgentTool", "ScopedGate", "agent_tool", "managed_task", "strictest_sandbox"]

#: Managed agents may hand tasks on to their own managed agents this many levels deep.
MAX_AGENT_DEPTH = 5

# How much each sandbox mode holds a program in: "auto" is bubblewrap where it runs, else a process.
_SANDBOX_RANK = {"none": 0, "process": 1, "auto": 2, "bwrap": 3}

_TASK_DOC = "Long, detailed description of the task: the agent knows only what you write here."
_ARGS_DOC = "Optional JSON data the agent needs for the task (shown to it with the task)."


@dataclass(frozen=True, eq=False)
class AgentTool(Tool):
    """The tool a managed agent is to its parent: ``name(task, additional_args=None)``, run by the gate
    inside the call (`Tool.in_call`), never in a thread of its own."""

    agent: Any = field(repr=False, default=None)
    in_call: bool = field(repr=False, default=True)

    def run(self, args: Mapping[str, Any], timeout_s: float | None = None) -> Any:
        raise ConfigurationError(f"managed agent {self.name!r} runs only as a call through its parent's gate")

    def run_in_call(self, args: Mapping[str, Any], scope: Any) -> Any:
        return self.agent.run_managed(str(args["task"]), args.get("additional_args"), scope)


def agent_tool(agent: Any) -> AgentTool:
    """The tool of a managed agent (it needs a `name` that is an identifier and a `description`)."""
    name, description = agent.name, agent.description
    if not isinstance(name, str) or not name.isidentifier():
        raise ConfigurationError(f"a managed agent needs a name that is a Python identifier, got {name!r}: "
                                 "CodeAgent(..., name='researcher', description='…')")
    if not description or not str(description).strip():
        raise ConfigurationError(f"managed agent {name!r} needs a description (what to ask it), as the "
                                 "parent's model sees it: CodeAgent(..., name=…, description='…')")

    def call(task: str, additional_args: dict[str, Any] | None = None) -> Any:
        raise ConfigurationError(f"managed agent {name!r} runs only as a call through its parent's gate")

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"{description}\n\nArgs:\n    task: {_TASK_DOC}\n    additional_args: {_ARGS_DOC}\n"
    built = AgentTool.from_function(call, name=name)  # side effect undeclared: destructive unless the policy says
    object.__setattr__(built, "agent", agent)
    return built  # type: ignore[return-value]


def strictest_sandbox(*modes: str | None) -> str | None:
    """The mode that holds a program in most tightly of `modes` (None: no sandbox named, ignored).

    A managed agent's programs run in the strictest of its own mode and every mode above it in the
    chain: a sub-agent declared with ``sandbox="process"`` inside a parent isolated by bubblewrap
    would otherwise reach the host's files and network directly, around the gate.
    """
    named = [m for m in modes if m is not None]
    return max(named, key=lambda m: _SANDBOX_RANK.get(m, len(_SANDBOX_RANK))) if named else None


def managed_task(name: str, task: str, additional_args: Mapping[str, Any] | None = None) -> str:
    """The task a managed agent is given (smolagents' wording): who asks, what, and what to hand back."""
    extra = ""
    if additional_args:
        extra = ("\nYou have also been given these additional arguments (JSON):\n"
                 + json.dumps(additional_args, ensure_ascii=False, default=repr, indent=1) + "\n")
    return (f"You're a helpful agent named '{name}'.\nYou have been submitted this task by your manager.\n---\n"
            f"Task:\n{task}\n---\n{extra}"
            "You're helping your manager solve a wider task: so make sure to not provide a one-line answer, but "
            "give as much information as possible to give them a clear understanding of the answer.\n"
            "Everything your manager gets is what you pass to final_answer(...): what you print is lost. Even if "
            "you cannot finish the task, give back as much context as possible, so that your manager can act "
            "upon it.")


class ScopedGate:
    """The gate as a managed agent's interpreter sees it: each call goes to the run's gate in the
    agent's context (`proctor.gate.run.AgentContext`), whose tool table is the agent's own; nothing is
    registered on the run's gate, so the parent's programs cannot name the agent's tools. A
    `proctor.interpreter.interpreter.GateLike`."""

    def __init__(self, gate: Gate) -> None:
        self._gate = gate
        self.audit = gate.audit
        self.policy = gate.policy

    def policy_for(self, ctx: RunContext) -> PolicyLike:
        """The policy deciding the run the agent works in (its interpreter checks the run's `sandbox:`)."""
        return self._gate.policy_for(ctx)

    def register(self, *tools: Tool) -> None:
        """Nothing to do: the agent's tools were checked on its own gate and travel in its context."""

    def start_run(self) -> RunContext:
        raise ConfigurationError("a managed agent's interpreter runs only inside its parent's run")

    def finish_run(self, ctx: RunContext, status: str = "done") -> None:
        """Never asked: the interpreter finishes only a run it started, and this gate starts none."""
        raise ConfigurationError("a managed agent's interpreter runs only inside its parent's run")

    def submit(self, tool: str, args: Mapping[str, JSONValue] | None = None, *, context: RunContext | None = None,
               call_id: str | None = None, parent: Context | None = None,
               on_result: Callable[[object, ProctorError | None], None] | None = None,
               position: CallPosition | None = None) -> CallOutcome:
        return self._gate.submit(tool, args, context=context, call_id=call_id, parent=parent, on_result=on_result,
                                 position=position)

    def refuse(self, tool: str, reason: str, *, context: RunContext | None = None, call_id: str | None = None,
               parent: Context | None = None, args_sha256: str | None = None,
               args_bytes: int | None = None) -> CallOutcome:
        return self._gate.refuse(tool, reason, context=context, call_id=call_id, parent=parent,
                                 args_sha256=args_sha256, args_bytes=args_bytes)
