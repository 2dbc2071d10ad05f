"""End-to-end tests of CodeAgent with a ScriptedModel, the real interpreter, gate, audit log and spans."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proctor.agent import CodeAgent, ScriptedModel
from proctor.approval import CallbackApprover
from proctor.audit import verify
from proctor.policy import Policy
from proctor.testing import InMemoryAudit, SpanCapture

from .conftest import TOOLS, policy_data, program

SHOPPING = program('''
price = get_price                                   # an alias
def total(items):                                   # a helper the model defined
    return sum(price(i) for i in items)             # calls inside a generator
cheap = sorted(["apple", "pear", "plum"], key=lambda i: get_price(i))   # calls inside a key lambda
prices = list(map(get_price, ["fig"]))              # a call through map()
print(cheap, total(cheap), prices)
send_note("team", f"cheapest: {cheap[0]}")
''')
ANSWER = program('final_answer({"cheapest": cheap[0], "total": total(cheap)})')


def test_run_gives_answer_status_calls_audit_and_spans(policy: Policy, tmp_path: Path) -> None:
    """A two-step run: the answer, status done, every call in the step records, a verified log, a span per call."""
    capture = SpanCapture()
    audit_path = tmp_path / "audit.jsonl"
    with CodeAgent(TOOLS, ScriptedModel([SHOPPING, ANSWER]), policy, audit=audit_path,
                   tracer=capture.tracer) as agent:
        result = agent.run("Which fruit is cheapest?", principal="alice", labels={"env": "test"})
    assert result.status == "done", result.error
    assert result.answer == {"cheapest": "plum", "total": 4.0}
    calls = [(c.tool, dict(c.args)) for c in result.tool_calls]
    sorted_keys = [("get_price", {"item": i}) for i in ("apple", "pear", "plum")]
    total = [("get_price", {"item": i}) for i in ("plum", "apple", "pear")]
    assert calls == [*sorted_keys, ("get_price", {"item": "fig"}), *total,
                     ("send_note", {"to": "team", "text": "cheapest: plum"}), *total]
    assert [len(s.tool_calls) for s in result.steps] == [8, 3]
    assert all(c.status == "ok" and c.decision is not None for c in result.tool_calls)
    assert result.steps[1].final_answer and result.steps[0].code is not None
    assert "['plum', 'apple', 'pear'] 4.0 [3.0]" in result.steps[0].observation

    assert result.audit_path == str(audit_path)
    report = verify(audit_path)
    assert report.ok, report.failure

    tool_spans = capture.spans("execute_tool ")
    assert len(tool_spans) == len(result.tool_calls) == 11
    steps = {s.context.span_id: s for s in capture.spans("step ")}
    assert len(steps) == 2
    assert all(s.parent is not None and s.parent.span_id in steps for s in tool_spans)
    (run_span,) = capture.spans("invoke_agent ")
    assert format(run_span.context.trace_id, "032x") == result.trace_id


def test_step_records_reach_the_audit_with_usage(policy: Policy) -> None:
    """Each step is an audit record with the model's usage and the ids of its calls."""
    audit = InMemoryAudit()
    with CodeAgent(TOOLS, ScriptedModel([SHOPPING, ANSWER]), policy, audit=audit) as agent:
        result = agent.run("Which fruit is cheapest?")
    steps = audit.of_kind("step")
    assert [s["step"] for s in steps] == [1, 2]
    assert steps[0]["usage"]["total_tokens"] == result.steps[0].usage.total_tokens > 0
    assert steps[0]["call_ids"] == [c.call_id for c in result.steps[0].tool_calls]
    assert audit.kinds()[0] == "run_started" and audit.kinds()[-1] == "run_finished"
    assert audit.of_kind("run_finished")[0]["status"] == "done"


def test_no_code_is_a_parse_error_observation(policy: Policy) -> None:
    """An answer without code runs nothing; the model is told the expected format and goes on."""
    model = ScriptedModel(["The answer is plum.", program("final_answer('plum')")])
    with CodeAgent(TOOLS, model, policy) as agent:
        result = agent.run("Cheapest fruit?")
    assert result.status == "done" and result.answer == "plum"
    first = result.steps[0]
    assert first.code is None and first.error is not None and "no code block" in first.observation
    assert "no code block" in model.calls[1][-1]["content"]


def test_denials_are_observations_and_the_tool_never_runs(policy: Policy) -> None:
    """A denied call raises at its call site; the model sees the decision and the reason, and continues."""
    model = ScriptedModel([program("delete_item('fig')\nprint('unreachable')"), program("final_answer('kept')")])
    with CodeAgent(TOOLS, model, policy) as agent:
        result = agent.run("Remove figs.")
    assert result.status == "done" and result.answer == "kept"
    (call,) = result.steps[0].tool_calls
    assert call.status == "denied" and call.decision is not None and call.decision.outcome == "deny"
    assert call.decision.rules == ("no-deletes",)
    shown = model.calls[1][-1]["content"]
    assert "ToolDenied" in shown and "nothing is deleted" in shown and "unreachable" not in shown


def test_approval_answers_are_in_the_call_records(policy: Policy) -> None:
    """A call that needs approval runs when approved and is refused, catchable, when not."""
    answers = iter([True, False])
    approver = CallbackApprover(lambda _req: next(answers))
    code = '''
out = []
for who in ["boss", "auditor"]:
    try:
        out.append(send_note(who, "hi"))
    except ApprovalDenied as e:
        out.append("refused")
final_answer(out)
'''
    with CodeAgent(TOOLS, ScriptedModel([program(code)]), policy, approver=approver) as agent:
        result = agent.run("Say hi.")
    assert result.answer == ["sent to boss", "refused"]
    first, second = result.tool_calls
    assert first.status == "ok" and first.approval is not None and first.approval.startswith("approve")
    assert second.status == "denied" and second.error_type == "ApprovalDenied"


def test_max_steps(policy: Policy) -> None:
    """Without a final answer the run stops at max_steps, with every step recorded."""
    model = ScriptedModel([program("print(get_price('fig'))")] * 5)
    with CodeAgent(TOOLS, model, policy, max_steps=3) as agent:
        result = agent.run("Loop.")
    assert result.status == "max_steps" and result.answer is None
    assert len(result.steps) == 3 and len(result.tool_calls) == 3 and len(model.calls) == 3


def test_run_wide_budget_stops_the_run() -> None:
    """A call refused by a budget over the whole run ends the run: status budget_exhausted."""
    policy = Policy.from_dict(policy_data(budgets=[{"name": "run-calls", "limit": {"calls": 3}}]))
    model = ScriptedModel([program("for i in ['apple'] * 5:\n    get_price(i)"), program("final_answer(1)")])
    with CodeAgent(TOOLS, model, policy) as agent:
        result = agent.run("Loop.")
    assert result.status == "budget_exhausted"
    assert result.error is not None and "run-calls" in result.error
    assert [c.status for c in result.tool_calls] == ["ok", "ok", "ok", "denied"]
    assert result.tool_calls[-1].error_type == "BudgetExceeded"
    assert len(model.calls) == 1  # the model was not asked again
    assert result.budget_usage["run-calls"]["calls"] == 3


def test_scoped_budget_refusal_is_only_an_observation() -> None:
    """A budget that covers one tool refuses that tool; the run goes on."""
    policy = Policy.from_dict(policy_data(budgets=[{"name": "notes", "match": {"tool": "send_note"},
                                                    "limit": {"calls": 1}}]))
    code = "for n in range(2):\n    try:\n        send_note('team', str(n))\n    except BudgetExceeded:\n" \
           "        print('no more notes')"
    model = ScriptedModel([program(code), program("final_answer('ok')")])
    with CodeAgent(TOOLS, model, policy) as agent:
        result = agent.run("Notes.")
    assert result.status == "done"
    assert [c.status for c in result.tool_calls] == ["ok", "denied"]
    assert "no more notes" in result.steps[0].observation


def test_model_token_budget_is_enforced_between_steps() -> None:
    """Model tokens are charged after each reply; the next step does not start past the limit."""
    policy = Policy.from_dict(policy_data(budgets=[{"name": "model", "limit": {"model_tokens": 100}}]))
    model = ScriptedModel([program("x = 1  # " + "padding " * 60), program("final_answer(x)")])
    with CodeAgent(TOOLS, model, policy) as agent:
        result = agent.run("Think hard.")
    assert result.status == "budget_exhausted"
    assert result.error is not None and "model tokens" in result.error
    assert len(result.steps) == 1 and len(model.calls) == 1
    assert result.budget_usage["model"]["model_tokens"] == result.usage.total_tokens > 100


def test_model_cost_budget() -> None:
    """A model_cost_usd limit stops the run once the priced usage reaches it."""
    policy = Policy.from_dict(policy_data(budgets=[{"name": "model", "limit": {"model_cost_usd": 0.001}}]))
    model = ScriptedModel([program("x = 1"), program("final_answer(x)")], cost_per_1k_tokens=1.0)
    with CodeAgent(TOOLS, model, policy) as agent:
        result = agent.run("Spend.")
    assert result.status == "budget_exhausted" and result.cost_usd is not None and result.cost_usd >= 0.001


def test_reset_clears_the_interpreter_and_the_transcript(policy: Policy) -> None:
    """reset=True (the default) leaves no variable and no message of an earlier run; reset=False keeps both."""
    model = ScriptedModel([program("x = 41\nfinal_answer(x)"), program("final_answer(x + 1)"),
                           program("final_answer('fresh')"), program("x = 41\nfinal_answer(x)"),
                           program("final_answer(x + 1)")])
    with CodeAgent(TOOLS, model, policy, max_steps=2) as agent:
        assert agent.run("Set x.").answer == 41
        fresh = agent.run("Use x.")
        assert fresh.steps[0].error is not None and "NameError" in fresh.steps[0].error
        assert fresh.answer == "fresh"
        assert not any("Set x." in str(m["content"]) for m in model.calls[1])
        assert agent.run("Set x.").answer == 41
        kept = agent.run("Use x.", reset=False)
    assert kept.answer == 42
    assert any("Set x." in str(m["content"]) for m in model.calls[-1])


def test_final_answer_checks_can_reject_an_answer(policy: Policy) -> None:
    """A failing check turns the final answer into an observation; the loop continues."""
    def is_number(answer: Any, memory: Any) -> bool:
        return isinstance(answer, (int, float))

    model = ScriptedModel([program("final_answer('three')"), program("final_answer(3)")])
    with CodeAgent(TOOLS, model, policy, final_answer_checks=[is_number]) as agent:
        result = agent.run("How many?")
    assert result.status == "done" and result.answer == 3
    assert not result.steps[0].final_answer and "rejected by check is_number" in result.steps[0].observation


def test_planning_steps(policy: Policy) -> None:
    """With planning_interval=2 the model is asked for a plan before steps 1 and 3."""
    model = ScriptedModel(["1. look\n2. answer", program("a = 1"), program("b = 2"), "revised plan",
                           program("final_answer(a + b)")])
    with CodeAgent(TOOLS, model, policy, planning_interval=2) as agent:
        result = agent.run("Add.")
    assert result.answer == 3
    assert [(s.kind, s.number) for s in result.steps] == [
        ("planning", 1), ("action", 1), ("action", 2), ("planning", 3), ("action", 3)]
    assert "Do not write code now" in model.calls[0][-1]["content"]


def test_model_failure_is_a_run_error(policy: Policy) -> None:
    """A model that fails ends the run with status error and its message; nothing raises."""
    with CodeAgent(TOOLS, ScriptedModel([program("y = 1")]), policy) as agent:
        result = agent.run("Go.")
    assert result.status == "error" and result.error is not None and "ran out of responses" in result.error
    assert len(result.steps) == 2 and result.steps[1].error == result.error


def test_system_prompt_tells_the_model_what_the_policy_does(policy: Policy) -> None:
    """Each tool appears with its signature, docstring, side-effect class and the policy's treatment."""
    model = ScriptedModel([program("final_answer(1)")])
    with CodeAgent(TOOLS, model, policy, authorized_imports=["math"]) as agent:
        agent.run("Go.")
    prompt = model.calls[0][0]["content"]
    assert "def get_price(item: str) -> float:" in prompt and "The price of an item." in prompt
    assert "side effect: destructive; policy: denied (nothing is deleted)" in prompt
    assert "needs human approval when args.to != 'team'" in prompt
    assert "You may import: math." in prompt


def test_a_program_that_runs_too_long_is_stopped_and_the_run_goes_on(policy: Policy) -> None:
    """A timeout kills the program; the model is told, including that earlier state is gone."""
    model = ScriptedModel([program("x = 1\nwhile True:\n    pass"), program("final_answer('recovered')")])
    with CodeAgent(TOOLS, model, policy, timeout=1) as agent:
        result = agent.run("Spin.")
    assert result.status == "done" and result.answer == "recovered"
    assert result.steps[0].error is not None and "ExecutionTimeout" in result.steps[0].error
    assert "variables and functions from earlier programs are gone" in model.calls[1][-1]["content"]
    assert result.steps[1].final_answer


def test_run_wall_time_budget_is_checked_between_steps() -> None:
    """A run-wide wall_time budget stops the run between steps even when no tool is called."""
    policy = Policy.from_dict(policy_data(budgets=[{"name": "clock", "limit": {"wall_time": "300ms"}}]))
    model = ScriptedModel([program("import time\ntime.sleep(0.4)"), program("final_answer(1)")])
    with CodeAgent(TOOLS, model, policy, authorized_imports=["time"]) as agent:
        result = agent.run("Wait.")
    assert result.status == "budget_exhausted" and result.error is not None and "clock" in result.error
    assert len(model.calls) == 1
