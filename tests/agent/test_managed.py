"""Managed agents: a parent's programs call a sub-agent like a tool, governed, inside the parent's run.

ScriptedModel plays both agents; programs run in the real sandboxed interpreter.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from proctor.agent import CodeAgent, ScriptedModel, ToolCallingAgent
from proctor.agent.models import ModelResponse, ToolCallRequest
from proctor.approval import CallbackApprover
from proctor.approval.base import ApprovalRequest
from proctor.audit import verify
from proctor.errors import ConfigurationError
from proctor.policy import Policy
from proctor.testing import InMemoryAudit, SpanCapture
from proctor.tools import tool

from .conftest import delete_item, get_price, policy_data, program, send_note

RESEARCHER = "Finds prices of fruit."


def parent_policy(**extra: Any) -> Policy:
    """The agent tests' policy, with the researcher declared a read (it is destructive otherwise)."""
    tools = {"researcher": {"side_effect": "read"}, **extra.pop("tools", {})}
    return Policy.from_dict(policy_data(tools=tools, **extra))


def researcher(*answers: str, policy: Policy | None = None, **kwargs: Any) -> CodeAgent:
    return CodeAgent([get_price, send_note, delete_item], ScriptedModel(list(answers)), policy,
                     name="researcher", description=RESEARCHER, **kwargs)


def manager(sub: Any, *answers: str, policy: Policy | None = None, **kwargs: Any) -> CodeAgent:
    return CodeAgent([get_price, send_note], ScriptedModel(list(answers)), policy or parent_policy(),
                     name="manager", managed_agents=[sub], **kwargs)


def test_parent_calls_the_managed_agent_like_a_tool_and_gets_its_final_answer() -> None:
    """researcher(task=…) runs the sub-agent on that task; its final answer is the call's value."""
    sub = researcher(program("final_answer({'fig': get_price('fig')})"))
    with manager(sub, program("r = researcher(task='What does a fig cost?')\nfinal_answer(r['fig'] * 2)")) as boss:
        result = boss.run("Price of two figs?")
    assert result.status == "done" and result.answer == 6.0
    (call,) = result.tool_calls
    assert call.tool == "researcher" and call.status == "ok" and call.args == {"task": "What does a fig cost?",
                                                                              "additional_args": None}
    system = boss.model.calls[0][0]["content"]  # type: ignore[attr-defined]
    assert "team members" in system and "def researcher(task: str" in system and RESEARCHER in system
    told = sub.model.calls[0][-1]["content"]  # type: ignore[attr-defined]
    assert "named 'researcher'" in told and "What does a fig cost?" in told
    assert sub.last_run is not None and sub.last_run.answer == {"fig": 3.0}


def test_an_undeclared_managed_agent_is_destructive_and_denied_by_default() -> None:
    """Without a tools: entry the agent-tool is destructive: the default deny refuses it and the sub never runs."""
    sub = researcher(program("final_answer(1)"))
    code = "try:\n    researcher(task='x')\nexcept ToolDenied as e:\n    final_answer(str(e))"
    with manager(sub, program(code), policy=Policy.from_dict(policy_data())) as boss:
        result = boss.run("Ask.")
    (call,) = result.tool_calls
    assert call.status == "denied" and call.side_effect == "destructive"
    assert "denied" in result.answer
    assert sub.model.calls == []  # type: ignore[attr-defined]


def test_a_run_wide_call_budget_of_ten_holds_for_the_whole_tree() -> None:
    """run-calls: 10 counts the parent's call to the agent and the agent's own calls: ten run, no more."""
    loop = ("ran, refused = 0, []\nfor i in range(20):\n    try:\n        get_price('fig')\n        ran += 1\n"
            "    except BudgetExceeded as e:\n        refused.append(e.budget)\n"
            "final_answer([ran, sorted(set(refused))])")
    sub = researcher(program(loop))
    after = "try:\n    get_price('plum')\nexcept BudgetExceeded as e:\n    r.append(e.budget)\nfinal_answer(r)"
    policy = parent_policy(budgets=[{"name": "run-calls", "limit": {"calls": 10}}])
    audit = InMemoryAudit()
    with manager(sub, program(f"r = researcher(task='count')\n{after}"), policy=policy, audit=audit) as boss:
        result = boss.run("Spend the budget.")
    assert result.answer == [9, ["run-calls"], "run-calls"]  # 1 parent call + 9 of the sub-agent = 10
    outcomes = audit.of_kind("call_outcome")
    assert sum(o["status"] == "ok" for o in outcomes) == 10
    assert len(outcomes) == 22 and {o["run_id"] for o in outcomes} == {result.run_id}
    assert audit.of_kind("run_finished")[0]["calls"]["ok"] == 10
    assert result.budget_usage["run-calls"]["calls"] == 10


def test_audit_records_name_the_managed_agent_and_the_log_verifies(tmp_path: Path) -> None:
    """The sub-agent's calls and steps carry the parent run's id, agent and parent_call_id; verify passes."""
    sub = researcher(program("final_answer(get_price('pear'))"))
    log = tmp_path / "audit.jsonl"
    with manager(sub, program("final_answer(researcher(task='pear'))"), audit=log) as boss:
        result = boss.run("Pear price?")
    assert result.answer == 2.0
    report = verify(log)
    assert report.ok and report.unfinished_runs == [] and report.dangling_intents == [], report.failure
    records = [r for r in _read(log) if r.get("run_id") == result.run_id]
    parent_call = next(r for r in records if r["kind"] == "call_intent" and r["tool"] == "researcher")
    assert "agent" not in parent_call  # the run's own agent: its records are as before
    mine = [r for r in records if r.get("agent") == "researcher"]
    assert {r["kind"] for r in mine} == {"call_intent", "call_outcome", "step"}
    assert all(r["run_id"] == result.run_id and r["parent_call_id"] == parent_call["call_id"] for r in mine)
    started = next(r for r in records if r["kind"] == "run_started")
    assert started["agent"] == "manager"


def test_audit_show_filters_and_shows_the_managed_agent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`proctor audit show --agent researcher` lists only its records; the table has an agent column."""
    import json

    from proctor.cli import main

    sub = researcher(program("final_answer(get_price('pear'))"))
    log = tmp_path / "audit.jsonl"
    with manager(sub, program("final_answer(researcher(task='pear'))"), audit=log) as boss:
        boss.run("Pear price?")
    capsys.readouterr()
    assert main(["audit", "show", str(log), "--agent", "researcher", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [r["kind"] for r in shown] == ["call_intent", "call_outcome", "step"]
    assert main(["audit", "show", str(log)]) == 0
    header = next(line for line in capsys.readouterr().out.splitlines() if "kind" in line)
    assert "agent" in header.split()
    from proctor.agent.replay import run_from_log

    run_id = shown[0]["run_id"]
    replayed = run_from_log(log, run_id)  # `audit show --run`: the parent's steps, the researcher's as notes
    assert [c.tool for c in replayed.result.tool_calls] == ["researcher"]
    assert any("managed agent 'researcher', its step 1: get_price ok" in n for ns in replayed.notes.values()
               for n in ns)


def _read(path: Path) -> list[dict[str, Any]]:
    import json

    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_sub_agent_spans_nest_under_the_parents_execute_tool_span() -> None:
    """invoke_agent researcher is a child of execute_tool researcher, in the parent's trace."""
    capture = SpanCapture()
    sub = researcher(program("final_answer(get_price('fig'))"))
    with manager(sub, program("final_answer(researcher(task='fig'))"), tracer=capture.tracer) as boss:
        result = boss.run("Fig?")
    assert result.status == "done"
    (call_span,) = capture.spans("execute_tool researcher")
    (sub_span,) = capture.spans("invoke_agent researcher")
    assert sub_span.parent is not None and sub_span.parent.span_id == call_span.context.span_id
    (inner,) = capture.spans("execute_tool get_price")
    sub_steps = {s.context.span_id for s in capture.spans("step ") if s.parent is not None
                 and s.parent.span_id == sub_span.context.span_id}
    assert inner.parent is not None and inner.parent.span_id in sub_steps
    assert {s.context.trace_id for s in capture.spans("")} == {call_span.context.trace_id}


def test_conditions_see_which_agent_is_calling() -> None:
    """run.agent names the managed agent for its calls: a rule can deny them what the parent may do."""
    rule = {"name": "researcher-reads-only", "match": {"tool": "send_note"}, "when": "run.agent == 'researcher'",
            "decision": "deny", "reason": "the researcher does not send notes"}
    base = policy_data(tools={"researcher": {"side_effect": "read"}})
    policy = Policy.from_dict({**base, "rules": [rule, *base["rules"]]})
    code = "try:\n    send_note('team', 'x')\nexcept ToolDenied as e:\n    final_answer(str(e))"
    sub = researcher(program(code))
    with manager(sub, program("r = researcher(task='note')\nfinal_answer([r, send_note('team', 'y')])"),
                 policy=policy) as boss:
        result = boss.run("Notes.")
    refused, sent = result.answer
    assert "does not send notes" in refused and sent == "sent to team"


def test_the_sub_agents_own_policy_can_narrow_but_never_widen() -> None:
    """Its own allow-all policy does not lift the run's deny; its own deny refuses what the run allows."""
    own = Policy.from_dict({"version": 1, "default": "allow", "rules": [
        {"name": "no-figs", "match": {"tool": "get_price"}, "when": "args.item == 'fig'", "decision": "deny",
         "reason": "figs are off limits"}]})
    code = ("out = []\nfor f in [lambda: delete_item('fig'), lambda: get_price('fig'), lambda: get_price('pear')]:\n"
            "    try:\n        out.append(f())\n    except ToolDenied as e:\n        out.append(str(e))\n"
            "final_answer(out)")
    sub = researcher(program(code), policy=own)
    with manager(sub, program("final_answer(researcher(task='try'))")) as boss:
        result = boss.run("Try.")
    deleted, fig, pear = result.answer
    assert "nothing is deleted" in deleted  # the run's deny stands under an allow-all own policy
    assert "researcher's own policy: figs are off limits" in fig
    assert pear == 2.0
    calls = sub.last_run.tool_calls if sub.last_run else []
    assert calls[1].decision is not None and calls[1].decision.rules == ("reads", "researcher:no-figs")


def test_approvals_come_from_each_policy_that_asks() -> None:
    """The run policy's approval goes to the parent's approver, the own policy's to the agent's approver."""
    own = Policy.from_dict({"version": 1, "default": "allow", "rules": [
        {"name": "ask-me", "match": {"tool": "send_note"}, "decision": "require_approval", "reason": "mine"}]})
    seen: dict[str, list[tuple[str, str | None]]] = {"parent": [], "own": []}

    def asker(who: str, ok: bool) -> CallbackApprover:
        def answer(req: ApprovalRequest) -> bool:
            seen[who].append((str(req.args["to"]), req.run.agent))
            return ok
        return CallbackApprover(answer)

    code = ("out = []\nfor to in ['team', 'boss']:\n    try:\n        out.append(send_note(to, 'hi'))\n"
            "    except ApprovalDenied as e:\n        out.append('refused')\nfinal_answer(out)")
    sub = researcher(program(code), policy=own, approver=asker("own", True))
    with manager(sub, program("final_answer(researcher(task='notes'))"), approver=asker("parent", False)) as boss:
        result = boss.run("Notes.")
    # team: the run allows it, the own policy asks its approver (yes); boss: the run asks the parent's (no).
    assert result.answer == ["sent to team", "refused"]
    assert seen == {"own": [("team", "researcher")], "parent": [("boss", "researcher")]}


def test_a_sub_agent_without_an_answer_is_a_tool_error_for_the_parent() -> None:
    """A sub-agent stopping at max_steps fails the parent's call with ToolFailed saying how it ended."""
    sub = researcher(program("print('thinking')"), max_steps=1)
    code = "try:\n    researcher(task='never ends')\nexcept ToolFailed as e:\n    final_answer(str(e))"
    with manager(sub, program(code)) as boss:
        result = boss.run("Ask.")
    (call,) = result.tool_calls
    assert call.status == "failed" and call.error_type == "ToolFailed"
    assert call.error is not None and call.error.startswith("researcher: ManagedAgentError: managed agent")
    assert "ended without a final answer (max_steps)" in result.answer


@tool(side_effect="read")
def slow_lookup(item: str) -> str:
    """Look an item up slowly.

    Args:
        item: The item.
    """
    time.sleep(0.4)
    return item


def test_the_calls_timeout_holds_inside_the_sub_agent() -> None:
    """tools: researcher: {timeout} bounds the whole sub-agent: its later calls are refused, the call times out."""
    loop = ("n = 0\nfor i in range(10):\n    try:\n        slow_lookup('x')\n        n += 1\n"
            "    except BudgetExceeded:\n        pass\nprint(n)")
    sub = CodeAgent([slow_lookup], ScriptedModel([program(loop), program("final_answer('late')")]),
                    name="researcher", description=RESEARCHER)
    policy = parent_policy(tools={"researcher": {"side_effect": "read", "timeout": "1s"}})
    code = "try:\n    researcher(task='slow')\nexcept ToolFailed as e:\n    final_answer(str(e))"
    with manager(sub, program(code), policy=policy) as boss:
        result = boss.run("Slow.")
    (call,) = result.tool_calls
    assert call.status == "timeout" and "ran out of time" in result.answer
    ran = [c for c in sub.last_run.tool_calls if c.status == "ok"] if sub.last_run else []
    assert 1 <= len(ran) < 10
    assert len(sub.model.calls) == 1  # type: ignore[attr-defined]


@tool(side_effect="read")
def pull_the_plug(item: str) -> str:
    """A tool during which the user presses Ctrl-C.

    Args:
        item: The item.
    """
    raise KeyboardInterrupt


def test_ctrl_c_inside_a_sub_agent_records_every_ending() -> None:
    """An interrupt in the sub-agent's tool ends that call and the parent's call unknown, the run interrupted."""
    audit = InMemoryAudit()
    sub = CodeAgent([pull_the_plug], ScriptedModel([program("pull_the_plug('x')")]), name="researcher",
                    description=RESEARCHER)
    with manager(sub, program("researcher(task='x')"), audit=audit) as boss, pytest.raises(KeyboardInterrupt):
        boss.run("Go.")
    ended = {r["tool"]: r["status"] for r in audit.of_kind("call_outcome")}
    assert ended == {"pull_the_plug": "unknown", "researcher": "unknown"}
    assert {r["call_id"] for r in audit.of_kind("call_intent")} == {r["call_id"] for r in audit.of_kind("call_outcome")}
    assert audit.of_kind("run_finished")[0]["status"] == "interrupted"
    assert [s.get("agent") for s in audit.of_kind("step")] == ["researcher", None]


def test_a_chain_may_not_run_an_agent_twice_nor_nest_too_deep() -> None:
    """An agent already working in the chain is refused, as is a chain deeper than MAX_AGENT_DEPTH."""
    from proctor.agent.managed import MAX_AGENT_DEPTH

    def delegate_to(name: str) -> ScriptedModel:
        return ScriptedModel([ModelResponse("", (ToolCallRequest("c1", name, {"task": "go"}),)), "done"])

    allow = Policy.from_dict({"version": 1, "default": "allow"})
    # manager -> helper -> (another agent named) manager: refused by name.
    twin = ToolCallingAgent([], ScriptedModel(["never"]), allow, name="manager", description="A twin.")
    helper = ToolCallingAgent([], delegate_to("manager"), name="helper", description="Helps.",
                              managed_agents=[twin])
    boss = ToolCallingAgent([], delegate_to("helper"), allow, name="manager", managed_agents=[helper])
    boss.run("Go.")
    (inner,) = helper.last_run.tool_calls if helper.last_run else []
    assert inner.status == "failed" and "already working in this call chain" in (inner.error or "")
    assert twin.model.calls == []  # type: ignore[attr-defined]
    # A chain one deeper than allowed: the last hand-off fails.
    agent: Any = ToolCallingAgent([], ScriptedModel(["leaf answer"]), name="a0", description="Leaf.")
    chain = [agent]
    for i in range(1, MAX_AGENT_DEPTH + 2):
        agent = ToolCallingAgent([], delegate_to(f"a{i - 1}"), name=f"a{i}", description="Passes it on.",
                                 managed_agents=[agent])
        chain.append(agent)
    top = ToolCallingAgent([], delegate_to(chain[-1].name), allow, name="top", managed_agents=[chain[-1]])
    top.run("Go.")
    refused = [c for a in chain if a.last_run for c in a.last_run.tool_calls if c.status == "failed"]
    assert any(f"nest at most {MAX_AGENT_DEPTH} deep" in (c.error or "") for c in refused)
    assert chain[0].model.calls == []


def test_an_inbox_approval_inside_a_sub_agent_is_refused_not_suspended(tmp_path: Path) -> None:
    """A managed agent cannot suspend the run: an unanswered inbox approval refuses the call and is voided."""
    from proctor.approval import InboxApprover
    from proctor.store import RunStore

    store = RunStore.open(str(tmp_path / "runs.db"))
    code = "try:\n    send_note('boss', 'hi')\nexcept ApprovalTimeout as e:\n    final_answer(str(e))"
    sub = researcher(program(code))
    with manager(sub, program("final_answer(researcher(task='x'))"), approver=InboxApprover(store),
                 audit=str(tmp_path / "audit.jsonl")) as boss:
        result = boss.run("Go.")
    assert result.status == "done" and "cannot suspend its parent's run" in result.answer
    (filed,) = store.list_approvals(status=None)
    assert filed.status == "void"
    store.close()


def test_construction_checks_name_description_and_policy() -> None:
    """A managed agent needs an identifier name and a description; without a policy it runs only managed."""
    model = ScriptedModel([])
    with pytest.raises(ConfigurationError, match="description"):
        CodeAgent([], model, parent_policy(), managed_agents=[CodeAgent([], model, name="x")])
    with pytest.raises(ConfigurationError, match="identifier"):
        CodeAgent([], model, parent_policy(), managed_agents=[CodeAgent([], model, name="my agent",
                                                                        description="d")])
    with pytest.raises(ConfigurationError, match="already taken"):
        CodeAgent([get_price], model, parent_policy(),
                  managed_agents=[CodeAgent([], model, name="get_price", description="d")])
    with pytest.raises(ConfigurationError, match="no policy of its own"):
        CodeAgent([], model, name="loner", description="d").run("x")


def test_policy_test_and_explain_know_run_agent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`policy test` cases and `policy explain --run` set run.agent as the gate does."""
    from proctor.cli import main

    policy = tmp_path / "p.yaml"
    policy.write_text("version: 1\ndefault: allow\nrules:\n  - name: researcher-no-notes\n"
                      "    match: {tool: send_note}\n    when: \"run.agent == 'researcher'\"\n    decision: deny\n")
    cases = tmp_path / "cases.yaml"
    cases.write_text("- {tool: send_note, run: {agent: researcher}, expect: deny, rules: [researcher-no-notes]}\n"
                     "- {tool: send_note, run: {agent: manager}, expect: allow}\n")
    assert main(["policy", "check", str(policy)]) == 0
    assert main(["policy", "test", str(policy), str(cases)]) == 0
    capsys.readouterr()
    assert main(["policy", "explain", str(policy), "--tool", "send_note", "--args", "{}",
                 "--run", '{"agent": "researcher"}', "--json"]) == 0
    assert '"deny"' in capsys.readouterr().out


@tool(side_effect="read")
def read_secret(name: str) -> str:
    """Read a secret the researcher may use.

    Args:
        name: Which secret.
    """
    return "s3cret"


def test_the_parents_gate_does_not_know_the_sub_agents_tools() -> None:
    """A tool only the researcher has is not callable in the parent's context, even by a forged request."""
    sub = CodeAgent([read_secret], ScriptedModel([program("final_answer(len(read_secret('db')))")]),
                    name="researcher", description=RESEARCHER)
    with manager(sub, program("final_answer(researcher(task='x'))")) as boss:
        result = boss.run("Go.")
        assert result.answer == 6 and "read_secret" not in boss.gate.tools
        ctx = boss.gate.start_run(agent="manager")
        forged = boss.gate.submit("read_secret", {"name": "db"}, context=ctx)
    assert forged.record.status == "denied" and "unknown tool" in str(forged.error)


def test_a_durable_parent_runs_its_managed_agent_and_finishes(tmp_path: Path) -> None:
    """With a run store the parent's call to the researcher is journaled like any call; the run ends done."""
    from proctor.store import RunStore

    store = RunStore.open(str(tmp_path / "runs.db"))
    sub = researcher(program("final_answer(get_price('plum'))"))
    with manager(sub, program("final_answer(researcher(task='plum'))"), store=store,
                 audit=str(tmp_path / "audit.jsonl")) as boss:
        result = boss.run("Plum?")
    assert result.status == "done" and result.answer == 0.5
    assert store.get_run(result.run_id).status == "done"
    store.close()


def test_an_approval_wait_inside_the_sub_agent_ends_with_its_time() -> None:
    """A human who never answers a researcher's call cannot hold the run past the researcher's timeout."""
    import threading

    never = threading.Event()

    def stuck(_req: ApprovalRequest) -> bool:
        never.wait(30)  # an approver that does not answer (released at the end of the test)
        return True

    code = "try:\n    send_note('boss', 'hi')\nexcept ApprovalTimeout as e:\n    final_answer(str(e))"
    sub = researcher(program(code))
    policy = parent_policy(tools={"researcher": {"side_effect": "read", "timeout": "2s"}})
    began = time.monotonic()
    try:
        with manager(sub, program("final_answer(researcher(task='x'))"), policy=policy,
                     approver=CallbackApprover(stuck)) as boss:
            result = boss.run("Go.")
    finally:
        never.set()
    assert "approval timed out" in result.answer
    assert time.monotonic() - began < 25  # the policy's approval timeout (5 min) did not apply


def test_the_sub_agents_model_use_counts_in_the_runs_model_budget() -> None:
    """A run-wide model_tokens budget counts the researcher's replies too: it stops the tree."""
    policy = parent_policy(budgets=[{"name": "tokens", "limit": {"model_tokens": 2000}}])  # a reply: ~850 tokens
    sub = researcher(program("print(1)"), program("print(2)"), program("final_answer(3)"))
    code = "try:\n    researcher(task='x')\nexcept ToolFailed as e:\n    print(e)"
    with manager(sub, program(code), program("final_answer('late')"), policy=policy) as boss:
        result = boss.run("Go.")
    assert sub.last_run is not None and sub.last_run.status == "budget_exhausted" and 1 <= len(sub.last_run.steps) < 3
    assert result.status == "budget_exhausted" and len(result.steps) == 1
    spent = sum(s.usage.total_tokens for s in [*result.steps, *sub.last_run.steps])
    assert result.budget_usage["tokens"]["model_tokens"] == spent > 2000


def test_the_runs_wall_time_budget_stops_the_sub_agent_too() -> None:
    """A run-wide wall_time budget refuses the researcher's calls once spent, and stops it and its parent."""
    loop = ("n = 0\nfor i in range(60):\n    try:\n        slow_lookup('x')\n        n += 1\n"
            "    except BudgetExceeded as e:\n        print(e.budget)\n        break\nprint(n)")
    sub = CodeAgent([slow_lookup], ScriptedModel([program(loop), program("final_answer('late')")]),
                    name="researcher", description=RESEARCHER)
    # Generous for a loaded machine: the parent must reach its call to the researcher within it.
    policy = parent_policy(budgets=[{"name": "run-time", "limit": {"wall_time": "6s"}}])
    code = "try:\n    researcher(task='slow')\nexcept ToolFailed as e:\n    print(e)"
    with manager(sub, program(code), program("final_answer('never')"), policy=policy) as boss:
        result = boss.run("Slow.")
    assert sub.last_run is not None and sub.last_run.status == "budget_exhausted"
    assert [c.budget for c in sub.last_run.tool_calls if c.status == "denied"] == ["run-time"]
    assert result.status == "budget_exhausted" and result.answer is None
