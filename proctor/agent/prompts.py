"""System prompts: each tool with its signature, docstring, side-effect class and what the policy does with it.

Telling the model up front which calls will be refused or need a human saves the
steps it would spend finding out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from proctor.calls import SideEffect
from proctor.policy.admission import FactSource, facts_of
from proctor.termsafe import terminal_safe, text_safe
from proctor.tools import Tool

__all__ = ["PolicyDescriber", "code_agent_prompt", "describe_tools", "planning_prompt", "tool_calling_prompt"]


class PolicyDescriber(FactSource, Protocol):
    """What the prompts need of a policy (`proctor.Policy` is one): the tools' facts (read through
    admission, `facts_of`) and a line saying what it does with each."""

    def describe_tool(self, tool: str, side_effect: SideEffect | None = None) -> str: ...


def _policy_line(policy: PolicyDescriber, tool: Tool, side_effect: SideEffect) -> str:
    try:
        return policy.describe_tool(tool.name, side_effect)
    except Exception as exc:  # noqa: BLE001 - a prompt must still be built; the gate decides anyway
        return f"decided by the policy at each call ({type(exc).__name__})"


def describe_tools(tools: Iterable[Tool], policy: PolicyDescriber, *, python: bool = True) -> str:
    """One block per tool: signature, docstring, side-effect class and the policy's treatment."""
    blocks: list[str] = []
    for t in tools:
        side_effect = facts_of(policy, t.name, t.side_effect, t.cost).side_effect
        # A description is the tool author's (an MCP server's: anyone's): three quotes in it would close the
        # docstring and let it write lines that read as proctor's own (`# side effect: read`). As
        # `proctor.signatures` renders them, they become '''.
        # Nor may it drive a terminal or reorder what is read (ANSI escapes, bidi overrides): escaped, as is the
        # signature (an MCP server's titles and enum values are in it).
        args = "\n".join(f"        {terminal_safe(name)}: {_in_docstring(text_safe(text))}"
                         for name, text in t.arg_descriptions.items())
        doc = _in_docstring(text_safe(t.description)).replace("\n", "\n    ")
        governance = f"side effect: {side_effect}; policy: {_policy_line(policy, t, side_effect)}"
        if python:
            body = f'    """{doc}\n\n    Args:\n{args}\n    """' if args else f'    """{doc}"""'
            blocks.append(f"def {terminal_safe(t.signature_text())}:\n{body}\n    # {governance}")
        else:
            blocks.append(f"- {terminal_safe(t.name)}: {text_safe((t.description.splitlines() or [''])[0])}\n"
                          f"  {governance}")
    return "\n\n".join(blocks)


def _in_docstring(text: str) -> str:
    """`text` as it can stand inside a triple-quoted docstring without ending it (nor, ending in a quote or
    a backslash, running into the docstring's closing quotes)."""
    text = text.replace('"""', "'''")
    return text + " " if text.endswith(('"', "\\")) else text


_CODE_EXAMPLE = '''Example (with made-up tools, not yours):
Task: "How many of our three newest tickets are about billing? Tell the on-call engineer."

Thought: I will fetch the tickets, count the billing ones, and send one message.
```python
tickets = [get_ticket(t) for t in list_tickets(limit=3)]
billing = [t for t in tickets if "billing" in t["tags"]]
print(len(billing), [t["id"] for t in billing])
```
Observation:
Execution logs:
2 ['T-9', 'T-7']
Tool calls (4): list_tickets -> allow, ok; get_ticket -> allow, ok (3 times)

Thought: Now I notify on-call; this may need approval, so I handle a refusal.
```python
try:
    notify(to="oncall", text=f"{len(billing)} of the 3 newest tickets are billing")
    sent = True
except CallRefused as e:
    print("not sent:", e)
    sent = False
final_answer(f"2 of 3 tickets are about billing; on-call notified: {sent}")
```'''


def code_agent_prompt(tools: Sequence[Tool], policy: PolicyDescriber, authorized_imports: Sequence[str],
                      instructions: str | None = None) -> str:
    """The system prompt of a `CodeAgent`."""
    imports = ", ".join(sorted(authorized_imports)) if authorized_imports else "nothing (no imports)"
    agents = [t for t in tools if t.in_call]
    tools = [t for t in tools if not t.in_call]
    parts = [
        "You solve tasks by writing Python programs. Each turn, write one program in a ```python block. "
        "It runs, and you are shown what it printed, every tool call it made with the policy's decision, "
        "and any error. Then write the next program. When you have the answer, call final_answer(answer) "
        "inside a program.",
        "Every tool call is checked against a policy before it runs. A call that does not run raises at the "
        "call site: ToolDenied (the policy said no, or the arguments were invalid), ApprovalDenied or "
        "ApprovalTimeout (a human said no or did not answer), BudgetExceeded (a limit is reached). A tool that "
        "raised gives ToolFailed. All refusals derive from CallRefused; these names are available without "
        "import. Do not retry a refused call with the same arguments or try to get around it: "
        "work with what is allowed and say what was refused.",
        "Tools (call them as Python functions; they return Python values):\n\n" + describe_tools(tools, policy)
        + "\n\ndef final_answer(answer: Any) -> None:\n    \"\"\"End the task with `answer`.\"\"\"",
        *([_team(agents, policy)] if agents else []),
        f"You may import: {imports}. Variables and functions you define stay available to your later "
        "programs in this run. Print what you need to see: only printed output and the last expression's "
        "value come back to you.",
        "Answer in this format:\nThought: what you will do next and why.\n```python\n# the program\n```",
        _CODE_EXAMPLE,
    ]
    if instructions:
        parts.append("Additional instructions:\n" + instructions)
    return "\n\n".join(parts)


def _team(agents: Sequence[Tool], policy: PolicyDescriber) -> str:
    """The managed agents a code agent may hand tasks to (smolagents' wording)."""
    return ("You can also give tasks to team members (managed agents). Calling a team member works like calling a "
            "tool: give the task as the 'task' argument; it returns the member's final answer. The member knows only "
            "what you write, so be as detailed as you need. You may pass JSON data it needs as 'additional_args'. "
            "Its own tool calls are governed by the same policy. Team members:\n\n" + describe_tools(agents, policy))


def tool_calling_prompt(tools: Sequence[Tool], policy: PolicyDescriber, instructions: str | None = None) -> str:
    """The system prompt of a `ToolCallingAgent`."""
    parts = [
        "You solve tasks by calling the tools you are given, several at once when they are independent. "
        "Each result (or refusal) comes back to you. When you have the answer, call final_answer.",
        "Every call is checked against a policy before it runs; a refused call returns an error saying why "
        "(denied, approval denied, budget exhausted). Do not retry a refused call unchanged.",
        "Tools and how the policy treats them:\n" + describe_tools(tools, policy, python=False),
    ]
    if instructions:
        parts.append("Additional instructions:\n" + instructions)
    return "\n\n".join(parts)


def planning_prompt(step: int) -> str:
    """The message asking for an updated plan before action step `step`."""
    if step <= 1:
        return ("Before you start, write a short plan: the facts you are given, the facts you need to find, "
                "and the steps to take. Do not write code now.")
    return ("Update your plan before going on: what you have learned so far, what is still missing, and "
            "the next steps (mind any refused calls). Do not write code now.")


FINAL_ANSWER_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "final_answer",
        "description": "End the task with the answer.",
        "parameters": {
            "type": "object",
            "properties": {"answer": {"description": "The answer to the task."}},
            "required": ["answer"],
        },
    },
}
