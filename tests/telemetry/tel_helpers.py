"""Tools, a policy and a run shaped like an agent's, shared by the telemetry tests."""

from __future__ import annotations

from typing import Any

from opentelemetry.trace import Tracer

from proctor.approval import CallbackApprover
from proctor.gate import Gate
from proctor.policy import Policy
from proctor.telemetry import agent_span, step_span
from proctor.tools import tool


@tool(side_effect="read")
def lookup(order: str) -> str:
    """Look an order up.

    Args:
        order: Order id.
    """
    return f"order {order}: shipped"


@tool(side_effect="external", cost=1)
def send_email(to: str, body: str) -> str:
    """Send an email.

    Args:
        to: Recipient.
        body: Text.
    """
    return f"sent to {to}"


@tool(side_effect="destructive")
def wipe(target: str) -> str:
    """Wipe something.

    Args:
        target: What.
    """
    return "wiped"


@tool(side_effect="read")
def broken(x: int) -> int:
    """Always fails.

    Args:
        x: Anything.
    """
    raise ValueError(f"no such thing as {x}")


POLICY: dict[str, Any] = {
    "version": 1,
    "default": "deny",
    "tools": {"send_email": {"redact": ["body"]}},
    "budgets": [{"name": "mail", "match": {"tool": "send_email"}, "limit": {"calls": 3}}],
    "rules": [
        {"name": "reads", "match": {"side_effect": ["none", "read"]}, "decision": "allow"},
        {"name": "external-mail", "match": {"tool": "send_email"}, "decision": "require_approval",
         "reason": "mail leaving the company needs a human"},
        {"name": "no-wipe", "match": {"tool": "wipe"}, "decision": "deny", "reason": "never"},
    ],
    "approval": {"timeout": "5s"},
}

TOOLS = [lookup, send_email, wipe, broken]


def make_gate(tracer: Tracer | None, *, approve: bool = True) -> Gate:
    """A gate with the real policy engine and an approver that answers `approve`."""
    return Gate(Policy.from_dict(POLICY), approver=CallbackApprover(lambda req: approve, name="alice"),
                tracer=tracer, tools=TOOLS)


def run_two_steps(tracer: Tracer | None, gate: Gate) -> str:
    """An agent-shaped run: step 1 reads and is denied a wipe; step 2 mails (approved) and hits a failing tool.

    Returns the run id.
    """
    ctx = gate.start_run(principal="alice", labels={"env": "test"})
    with agent_span(tracer, agent_name="support", run=ctx.info, model="ollama_chat/qwen2.5-coder:7b") as run:
        with step_span(tracer, step=ctx.next_step(), parent=run, run=ctx.info) as step:
            step.usage(input_tokens=100, output_tokens=20)
            assert gate.submit("lookup", {"order": "A1"}, context=ctx, parent=step.context).error is None
            assert gate.submit("wipe", {"target": "db"}, context=ctx, parent=step.context).error is not None
        with step_span(tracer, step=ctx.next_step(), parent=run, run=ctx.info) as step:
            step.usage(input_tokens=150, output_tokens=30)
            assert gate.submit("send_email", {"to": "bob@else.org", "body": "secret plan"}, context=ctx,
                               parent=step.context).error is None
            assert gate.submit("broken", {"x": 3}, context=ctx, parent=step.context).error is not None
        run.finish("done")
    gate.finish_run(ctx)
    return ctx.info.id
