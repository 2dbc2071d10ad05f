"""smolagents' own ``managed_agents`` under a governed manager: no ungoverned path, at any depth.

The attack this answers: a manager governed the documented way (``executor=GovernedExecutor(…)``)
with ``managed_agents=[researcher]`` let the researcher run in smolagents' own executor, so its
``book_table(people=9)`` ran though the policy denies it and a budget of 2 ``charge`` calls let 4
run; giving the researcher its own GovernedExecutor opened a second run with fresh budgets and, on
one audit file, failed with ``locked by another writer``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import smolagents
import yaml
from smolagents.local_python_executor import CodeOutput, PythonExecutor

from integrations.smol_tools import RAN, ScriptedSmolModel, book_table, charge
from proctor import Gate, Policy
from proctor.errors import ConfigurationError
from proctor.integrations.smolagents import GovernedExecutor
from proctor.testing import InMemoryAudit, SpanCapture

POLICY: dict[str, Any] = {
    "version": 1,
    "default": "deny",
    "tools": {"book_table": {"side_effect": "external"}, "charge": {"side_effect": "destructive"},
              "researcher": {"side_effect": "read"}, "clerk": {"side_effect": "read"},
              "final_answer": {"side_effect": "none"}},
    "budgets": [{"name": "two-charges", "match": {"tool": "charge"}, "limit": {"calls": 2}}],
    "rules": [
        {"name": "agents", "match": {"tool": ["researcher", "clerk", "final_answer"]}, "decision": "allow"},
        {"name": "small-tables", "match": {"tool": "book_table"}, "when": "args.people <= 6", "decision": "allow"},
        {"name": "charges", "match": {"tool": "charge"}, "decision": "allow"},
    ],
}


def code(body: str) -> str:
    return f"Thought: go.\n<code>\n{body}\n</code>"


def charge_four_times() -> str:
    return code("out = []\nfor i in range(4):\n    try:\n        out.append(charge(i))\n"
                "    except BudgetExceeded as e:\n        out.append('refused')\nfinal_answer(str(out))")


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    RAN.clear()
    yield
    RAN.clear()


def researcher(model: Any, **kwargs: Any) -> Any:
    return smolagents.CodeAgent(tools=[book_table, charge], model=model, name="researcher",
                                description="Books tables and pays.", **kwargs)


def run_ids(audit: InMemoryAudit) -> set[str]:
    return {str(r["run_id"]) for r in audit.records if "run_id" in r}


def test_a_managed_agent_without_an_executor_is_governed_in_the_managers_run() -> None:
    """The researcher keeps smolagents' default executor: its calls still pass the manager's gate, in its run."""
    audit = InMemoryAudit()
    capture = SpanCapture()
    gate = Gate(Policy.from_dict(POLICY), audit=audit, tracer=capture.tracer)
    sub = researcher(ScriptedSmolModel([
        code("try:\n    book_table(people=9)\nexcept ToolDenied as e:\n    print('refused:', e)\n"
             "final_answer(book_table(people=4))"),
    ]))
    manager = smolagents.CodeAgent(tools=[], model=ScriptedSmolModel([
        code("r = researcher(task='book for nine, else four')\nfinal_answer(r)"),
    ]), managed_agents=[sub], executor=GovernedExecutor(gate, sandbox="process"))
    try:
        answer = manager.run("dinner")
    finally:
        manager.cleanup()
    assert "booked for 4" in str(answer)
    assert RAN == [("book_table", {"people": 4})]  # people=9 was denied at the gate, never ran
    intents = audit.of_kind("call_intent")
    assert [(r["tool"], r.get("agent")) for r in intents] == [
        ("researcher", None), ("book_table", "researcher"), ("book_table", "researcher")]
    assert len(run_ids(audit)) == 1  # one run: the manager's
    # The researcher's calls end before the manager's call to it does.
    assert [(r["tool"], r["status"]) for r in audit.of_kind("call_outcome")] == [
        ("book_table", "denied"), ("book_table", "ok"), ("researcher", "ok")]
    # The researcher's calls nest under the manager's call to it, in one trace.
    spans = {s.name: s for s in capture.spans()}
    call = spans["execute_tool researcher"]
    sub_run = spans["invoke_agent researcher"]
    assert sub_run.parent is not None and sub_run.parent.span_id == call.context.span_id
    tables = capture.spans("execute_tool book_table")
    assert len(tables) == 2 and all(s.context.trace_id == call.context.trace_id for s in tables)
    assert len({s.context.trace_id for s in capture.spans()}) == 1


def test_budgets_hold_across_the_manager_and_two_levels_of_managed_agents() -> None:
    """A budget of 2 charges holds for the whole tree: manager -> researcher (CodeAgent) -> clerk (ToolCallingAgent)."""
    audit = InMemoryAudit()
    gate = Gate(Policy.from_dict(POLICY), audit=audit)
    clerk = smolagents.ToolCallingAgent(tools=[charge], model=ScriptedSmolModel([
        ("charge", {"amount": 10}), ("charge", {"amount": 11}), ("final_answer", {"answer": "clerk done"}),
    ]), name="clerk", description="Charges cards.")
    sub = smolagents.CodeAgent(tools=[charge], model=ScriptedSmolModel([
        code("c = charge(1)\nr = clerk(task='charge twice')\nfinal_answer(c + ' / ' + r)"),
    ]), managed_agents=[clerk], name="researcher", description="Pays, with help.")
    manager = smolagents.CodeAgent(tools=[charge], model=ScriptedSmolModel([
        code("a = researcher(task='pay')\nfinal_answer(a)"),
        charge_four_times(),
    ]), managed_agents=[sub], executor=GovernedExecutor(gate, sandbox="process"))
    try:
        manager.run("pay things")
        assert [name for name, _ in RAN] == ["charge", "charge"]  # 1 by the researcher, 1 by the clerk
        outcomes = [(r["tool"], r["status"]) for r in audit.of_kind("call_outcome") if r["tool"] == "charge"]
        assert outcomes == [("charge", "ok"), ("charge", "ok"), ("charge", "denied")]
        agents = [r.get("agent") for r in audit.of_kind("call_intent") if r["tool"] == "charge"]
        assert agents == ["researcher", "clerk", "clerk"]
        assert len(run_ids(audit)) == 1
    finally:
        manager.cleanup()


def test_a_managed_agent_with_its_own_governed_executor_joins_the_run_on_one_audit_file(tmp_path: Path) -> None:
    """Both agents given GovernedExecutor(policy, audit=same file): one run, one writer, budgets shared."""
    log = tmp_path / "audit.jsonl"
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(yaml.safe_dump(POLICY))
    sub = researcher(ScriptedSmolModel([charge_four_times()]),
                     executor=GovernedExecutor(str(policy_file), audit=str(log), sandbox="process"))
    manager = smolagents.CodeAgent(tools=[charge], model=ScriptedSmolModel([
        code("r = researcher(task='pay four times')\nfinal_answer(r)"),
    ]), managed_agents=[sub], executor=GovernedExecutor(str(policy_file), audit=str(log), sandbox="process"))
    manager.run("pay")
    manager.cleanup()
    assert [name for name, _ in RAN] == ["charge", "charge"]
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len({r["run_id"] for r in lines if "run_id" in r}) == 1
    assert [r["kind"] for r in lines if r["kind"].startswith("run_")] == ["run_started", "run_finished"]


def test_a_managed_agent_in_an_executor_proctor_cannot_govern_is_refused_when_the_manager_is_built() -> None:
    """A managed CodeAgent whose programs run elsewhere (a remote executor) would call its tools there."""

    class RemoteExecutor(PythonExecutor):  # type: ignore[misc]
        def __call__(self, code_action: str) -> CodeOutput:
            raise AssertionError("never reached")

        def send_tools(self, tools: dict[str, Any]) -> None:
            pass

        def send_variables(self, variables: dict[str, Any]) -> None:
            pass

    sub = researcher(ScriptedSmolModel([]), executor=RemoteExecutor())
    model = ScriptedSmolModel([code("final_answer(researcher(task='x'))")])
    executor = GovernedExecutor(Gate(Policy.from_dict(POLICY)), sandbox="process")
    try:
        with pytest.raises(ConfigurationError, match=r"researcher runs its programs in RemoteExecutor.*"
                                                     r"executor=GovernedExecutor\(gate\)"):
            smolagents.CodeAgent(tools=[], model=model, managed_agents=[sub], executor=executor)
        assert model.seen == []  # refused before the model was asked anything
    finally:
        executor.cleanup()


def test_a_dataframe_handed_to_a_managed_agent_arrives_as_a_dataframe() -> None:
    """additional_args cross from the manager's program to the managed agent's as the objects they are."""
    gate = Gate(Policy.from_dict(POLICY))
    sub = smolagents.CodeAgent(tools=[], model=ScriptedSmolModel([
        code("final_answer(f'{type(df).__name__} {int(df.x.sum())}')"),
    ]), name="researcher", description="Reads data.", additional_authorized_imports=["pandas"])
    manager = smolagents.CodeAgent(tools=[], model=ScriptedSmolModel([
        code("import pandas as pd\nfinal_answer(researcher(task='sum x', additional_args={'df': "
             "pd.DataFrame({'x': [1, 2, 3]})}))"),
    ]), managed_agents=[sub], additional_authorized_imports=["pandas"],
        executor=GovernedExecutor(gate, sandbox="process"))
    try:
        assert "DataFrame 6" in str(manager.run("sum"))
    finally:
        manager.cleanup()
