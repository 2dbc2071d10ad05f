"""`agent.replay()`: the last run printed step by step from the agent's memory."""

from __future__ import annotations

import io

import pytest

from proctor.agent import CodeAgent, ScriptedModel
from proctor.approval import CallbackApprover
from proctor.errors import ConfigurationError
from proctor.policy import Policy

from .conftest import TOOLS, program

STEP_1 = program('''
print("apple costs", get_price("apple"))
send_note("boss", "prices are in")
delete_item("fig")
''', thought="Thought: price the apple, tell the boss, clean up.")
STEP_2 = program('final_answer("plum")', thought="Thought: the plum it is.")


def _replayed(agent: CodeAgent) -> str:
    out = io.StringIO()
    agent.replay(file=out)
    return out.getvalue()


def test_replay_prints_thoughts_programs_calls_decisions_approvals_and_outcome(policy: Policy) -> None:
    """Every step's thought and program, each call with its decision, rule and approval, and the summary."""
    approver = CallbackApprover(lambda _req: True)
    with CodeAgent(TOOLS, ScriptedModel([STEP_1, STEP_2]), policy, approver=approver, sandbox="auto") as agent:
        result = agent.run("Which fruit?")
        text = _replayed(agent)
    assert result.status == "done" and agent.last_run is result
    for expected in ("step 1", "step 2", "Thought: price the apple, tell the boss, clean up.",
                     "Thought: the plum it is.", 'send_note("boss", "prices are in")',
                     "get_price(item='apple')", "reads", "require_approval", "other-notes", "approve by callback",
                     "deny", "no-deletes", "ToolDenied", "apple costs 1.5", "summary", "plum", "done"):
        assert expected in text, (expected, text)
    assert text.index("step 1") < text.index("get_price(item='apple')") < text.index("step 2") \
        < text.index("summary")


def test_replay_shows_the_last_run_streamed_or_not(policy: Policy) -> None:
    """A streamed run is the last run too; replay shows that run, not an earlier one."""
    with CodeAgent(TOOLS, ScriptedModel([STEP_2, program('final_answer("fig")')]), policy,
                   sandbox="auto") as agent:
        agent.run("First.")
        *_, streamed = agent.run("Second.", stream=True)
        text = _replayed(agent)
    assert agent.last_run is streamed
    assert "fig" in text and "plum" not in text


def test_replay_before_any_run_says_what_to_do(policy: Policy) -> None:
    """Without a finished run there is nothing to replay, and the error says to run first."""
    with CodeAgent(TOOLS, ScriptedModel([]), policy, sandbox="auto") as agent:
        with pytest.raises(ConfigurationError, match=r"agent\.run\(task\) first"):
            agent.replay()
