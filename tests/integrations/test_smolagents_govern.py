"""`govern(agent, gate)`: a smolagents agent tree governed in one call, refused when built if any path escapes.

What this answers: smolagents never calls an agent's executor while the agent is built, so a tree
with a managed agent proctor cannot govern used to be refused only by ``agent.run()``; and a
``ToolCallingAgent`` manager called its tools and managed agents from the model's JSON tool calls,
outside proctor's reach.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import smolagents
from smolagents import tool
from smolagents.local_python_executor import CodeOutput, LocalPythonExecutor, PythonExecutor

from integrations.smol_tools import RAN, ScriptedSmolModel, book_table, charge
from proctor import Gate, Policy
from proctor.errors import ConfigurationError
from proctor.integrations.smolagents import GovernedExecutor, GovernedTool, govern, govern_tools
from proctor.testing import InMemoryAudit, SpanCapture
from proctor.tools import as_tool

POLICY: dict[str, Any] = {
    "version": 1,
    "default": "deny",
    "tools": {"book_table": {"side_effect": "external"}, "charge": {"side_effect": "destructive"},
              "researcher": {"side_effect": "read"}, "clerk": {"side_effect": "read"},
              "deep": {"side_effect": "read"}, "final_answer": {"side_effect": "none"}},
    "budgets": [{"name": "two-charges", "match": {"tool": "charge"}, "limit": {"calls": 2}}],
    "rules": [
        {"name": "agents", "match": {"tool": ["researcher", "clerk", "deep", "final_answer"]}, "decision": "allow"},
        {"name": "small-tables", "match": {"tool": "book_table"}, "when": "args.people <= 6", "decision": "allow"},
        {"name": "charges", "match": {"tool": "charge"}, "decision": "allow"},
    ],
}


class RemoteExecutor(PythonExecutor):  # type: ignore[misc]  # smolagents ships no type information
    """An executor running programs elsewhere (as E2B, Docker or Modal do): its tool calls would run there."""

    def __call__(self, code_action: str) -> CodeOutput:
        raise AssertionError("never reached: the tree is refused before any program runs")

    def send_tools(self, tools: dict[str, Any]) -> None:
        pass

    def send_variables(self, variables: dict[str, Any]) -> None:
        pass


def code(body: str) -> str:
    return f"Thought: go.\n<code>\n{body}\n</code>"


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    RAN.clear()
    yield
    RAN.clear()


def gate_with(audit: InMemoryAudit | None = None, capture: SpanCapture | None = None) -> Gate:
    return Gate(Policy.from_dict(POLICY), audit=audit, tracer=capture.tracer if capture is not None else None)


def run_ids(audit: InMemoryAudit) -> set[str]:
    return {str(r["run_id"]) for r in audit.records if "run_id" in r}


# -- refused when built, two levels deep ---------------------------------------------------------------


def remote_two_levels_down(manager_kind: str) -> tuple[Any, list[ScriptedSmolModel]]:
    """manager -> researcher -> deep, where deep (a CodeAgent) runs its programs in a remote executor."""
    models = [ScriptedSmolModel([code("final_answer('x')")]) for _ in range(3)]
    deep = smolagents.CodeAgent(tools=[charge], model=models[2], name="deep", description="Pays.",
                                executor=RemoteExecutor())
    researcher = smolagents.ToolCallingAgent(tools=[book_table], model=models[1], managed_agents=[deep],
                                             name="researcher", description="Books, with help.")
    if manager_kind == "code":
        manager: Any = smolagents.CodeAgent(tools=[], model=models[0], managed_agents=[researcher])
    else:
        manager = smolagents.ToolCallingAgent(tools=[], model=models[0], managed_agents=[researcher])
    return manager, models


@pytest.mark.parametrize("manager_kind", ["code", "tool_calling"])
def test_govern_refuses_a_tree_with_an_ungoverned_path_two_levels_down_when_the_agent_is_built(
        manager_kind: str) -> None:
    manager, models = remote_two_levels_down(manager_kind)
    before = dict(manager.tools), dict(manager.managed_agents)
    with pytest.raises(ConfigurationError, match=r"managed agent researcher -> deep runs its programs in "
                                                 r"RemoteExecutor, outside proctor's gate: build it with "
                                                 r"executor=GovernedExecutor\(gate\)"):
        govern(manager, gate_with())
    assert all(m.seen == [] for m in models)  # no model was asked anything
    assert (dict(manager.tools), dict(manager.managed_agents)) == before  # a refused agent is left as it was
    if manager_kind == "code":
        assert isinstance(manager.python_executor, LocalPythonExecutor)


def test_a_manager_built_with_a_governed_executor_refuses_the_same_tree_when_built() -> None:
    """The other documented way, ``CodeAgent(executor=GovernedExecutor(gate))``: smolagents' CodeAgent asks its
    executor ``executor or …`` at the end of __init__, where the executor checks the tree. If a smolagents
    release stops asking, this fails: the tree would then be refused only when run() starts."""
    tree, models = remote_two_levels_down("code")
    executor = GovernedExecutor(gate_with(), sandbox="process")
    try:
        with pytest.raises(ConfigurationError, match=r"researcher -> deep runs its programs in RemoteExecutor"):
            smolagents.CodeAgent(tools=[], model=models[0], managed_agents=[tree.managed_agents["researcher"]],
                                 executor=executor)
        assert all(m.seen == [] for m in models)
    finally:
        executor.cleanup()


def test_a_managed_agent_built_with_a_governed_executor_refuses_its_own_tree_when_built() -> None:
    """researcher (its own GovernedExecutor) -> deep (remote): refused as researcher is built, before any manager."""
    deep = smolagents.CodeAgent(tools=[], model=ScriptedSmolModel([]), name="deep", description="Pays.",
                                executor=RemoteExecutor())
    executor = GovernedExecutor(gate_with(), sandbox="process")
    try:
        with pytest.raises(ConfigurationError, match=r"managed agent deep runs its programs in RemoteExecutor"):
            smolagents.CodeAgent(tools=[], model=ScriptedSmolModel([]), managed_agents=[deep], name="researcher",
                                 description="Books.", executor=executor)
    finally:
        executor.cleanup()


def test_a_governed_executor_built_into_an_agent_needing_a_missing_module_is_refused_when_built() -> None:
    executor = GovernedExecutor(gate_with(), sandbox="process")
    try:
        with pytest.raises(ConfigurationError, match="not installed"):
            smolagents.CodeAgent(tools=[], model=ScriptedSmolModel([]), executor=executor,
                                 additional_authorized_imports=["surely_not_installed_pkg"])
    finally:
        executor.cleanup()


def test_govern_refuses_an_agent_whose_own_executor_escapes_or_answers_to_another_gate() -> None:
    gate = gate_with()
    remote = smolagents.CodeAgent(tools=[], model=ScriptedSmolModel([]), executor=RemoteExecutor())
    with pytest.raises(ConfigurationError, match=r"runs its programs in RemoteExecutor, outside proctor's gate: "
                                                 r"build it without executor= or executor_type="):
        govern(remote, gate)
    other = GovernedExecutor(gate_with(), sandbox="process")
    elsewhere = smolagents.CodeAgent(tools=[], model=ScriptedSmolModel([]), executor=other)
    try:
        with pytest.raises(ConfigurationError, match=r"has a GovernedExecutor of another gate \(or policy\): build "
                                                     r"it without executor= \(govern\(\) gives it one on this gate\)"):
            govern(elsewhere, gate)
    finally:
        other.cleanup()
    with pytest.raises(ConfigurationError, match=r"takes a smolagents CodeAgent or ToolCallingAgent, not a str"):
        govern("agent", gate)
    foreign = smolagents.ToolCallingAgent(tools=govern_tools([charge], gate_with()), model=ScriptedSmolModel([]))
    with pytest.raises(ConfigurationError, match=r"tool 'charge' was governed on another gate"):
        govern(foreign, gate)


def test_govern_refuses_a_tool_name_another_tool_holds_at_the_gate_when_built() -> None:
    """Two different tools of one name cannot both be the gate's: refused by govern(), not at the first step."""
    gate = gate_with()

    @tool  # smolagents warns about any other spelling of its decorator
    def charge(amount: int) -> str:  # another tool named charge
        """Charge differently.

        Args:
            amount: Euros.
        """
        return "other"

    gate.register(as_tool(charge))
    agent = smolagents.ToolCallingAgent(tools=[globals()["charge"]], model=ScriptedSmolModel([]))
    with pytest.raises(ConfigurationError, match=r"'charge'"):
        govern(agent, gate)
    assert not isinstance(agent.tools["charge"], GovernedTool)


# -- a governed ToolCallingAgent manager ---------------------------------------------------------------


def tool_calling_tree(extra_manager_steps: list[Any] | None = None) -> tuple[Any, dict[str, ScriptedSmolModel]]:
    """manager (ToolCallingAgent) -> researcher (CodeAgent, smolagents' own executor) -> clerk (ToolCallingAgent)."""
    models = {
        "clerk": ScriptedSmolModel([("book_table", {"people": 9}), ("book_table", {"people": 4}),
                                    ("charge", {"amount": 3}), ("final_answer", {"answer": "clerk done"})]),
        "researcher": ScriptedSmolModel([code("c = charge(1)\nr = clerk(task='book and pay')\n"
                                              "final_answer(c + ' / ' + r)")]),
        "manager": ScriptedSmolModel([("researcher", {"task": "book dinner and pay"}), ("charge", {"amount": 5}),
                                      ("final_answer", {"answer": "all done"}), *(extra_manager_steps or [])]),
    }
    clerk = smolagents.ToolCallingAgent(tools=[book_table, charge], model=models["clerk"], name="clerk",
                                        description="Books and pays.")
    researcher = smolagents.CodeAgent(tools=[charge], model=models["researcher"], managed_agents=[clerk],
                                      name="researcher", description="Pays, with help.")
    manager = smolagents.ToolCallingAgent(tools=[charge], model=models["manager"], managed_agents=[researcher],
                                          name="boss", max_steps=5)
    return manager, models


def test_a_governed_tool_calling_manager_and_its_managed_agents_share_one_run_two_levels_deep() -> None:
    audit = InMemoryAudit()
    capture = SpanCapture()
    gate = gate_with(audit, capture)
    manager, _ = tool_calling_tree()
    assert govern(manager, gate, sandbox="process") is manager
    assert manager.run("dinner") == "all done"
    # people=9 was denied at the gate; the budget of 2 charges held for the whole tree.
    assert RAN == [("charge", {"amount": 1}), ("book_table", {"people": 4}), ("charge", {"amount": 3})]
    charges = [(r.get("agent"), r["status"]) for r in audit.of_kind("call_outcome") if r["tool"] == "charge"]
    assert charges == [("researcher", "ok"), ("clerk", "ok"), (None, "denied")]
    tables = [(r.get("agent"), r["status"]) for r in audit.of_kind("call_outcome") if r["tool"] == "book_table"]
    assert tables == [("clerk", "denied"), ("clerk", "ok")]
    assert len(run_ids(audit)) == 1
    assert [r["status"] for r in audit.of_kind("run_finished")] == ["done"]
    # One trace: the manager's run, its call to researcher, researcher's run, its call to clerk, clerk's run.
    spans = {s.name: s for s in capture.spans()}
    assert len({s.context.trace_id for s in capture.spans()}) == 1

    def parent_of(name: str) -> str:
        parent = spans[name].parent
        assert parent is not None
        return next(s.name for s in capture.spans() if s.context.span_id == parent.span_id)

    assert parent_of("execute_tool researcher") == "invoke_agent boss"
    assert parent_of("invoke_agent researcher") == "execute_tool researcher"
    assert parent_of("invoke_agent clerk") == "execute_tool clerk"
    assert parent_of("execute_tool clerk") == "invoke_agent researcher"


def test_each_run_of_a_governed_tool_calling_agent_is_its_own_gate_run_with_fresh_budgets() -> None:
    audit = InMemoryAudit()
    gate = gate_with(audit)
    agent = smolagents.ToolCallingAgent(tools=[charge], model=ScriptedSmolModel([
        ("charge", {"amount": 1}), ("charge", {"amount": 2}), ("charge", {"amount": 3}),
        ("final_answer", {"answer": "a"}), ("charge", {"amount": 4}), ("final_answer", {"answer": "b"}),
    ]), max_steps=6)
    govern(agent, gate)
    assert agent.run("first") == "a"
    assert agent.run("second") == "b"
    assert [r["amount"] for _, r in RAN] == [1, 2, 4]  # the third charge of the first run hit the budget
    assert len(run_ids(audit)) == 2
    intents = audit.of_kind("call_intent")
    assert [r["step"] for r in intents] == [1, 2, 3, 1]  # smolagents' own step numbers
    # Each smolagents step leaves a step record naming its calls.
    steps = [(r["step"], r["call_ids"]) for r in audit.of_kind("step")]
    assert steps == [(1, [intents[0]["call_id"]]), (2, [intents[1]["call_id"]]), (3, [intents[2]["call_id"]]),
                     (4, []), (1, [intents[3]["call_id"]]), (2, [])]


def test_a_tool_added_after_govern_is_refused_before_the_model_is_asked() -> None:
    model = ScriptedSmolModel([("book_table", {"people": 2})])
    agent = smolagents.ToolCallingAgent(tools=[charge], model=model)
    govern(agent, gate_with())
    agent.tools["book_table"] = book_table
    with pytest.raises(ConfigurationError, match=r"'book_table' was added after govern\(\), and smolagents would "
                                                 r"call it outside the gate: call govern\(agent, gate\) again"):
        agent.run("book")
    assert model.seen == [] and RAN == []
    govern(agent, agent.python_executor.gate)  # governing again takes it in
    assert isinstance(agent.tools["book_table"], GovernedTool)


def test_a_governed_code_agent_manages_a_governed_tool_calling_agent_inside_its_own_run() -> None:
    """govern() on both: the managed ToolCallingAgent's own executor does not open a second run."""
    audit = InMemoryAudit()
    gate = gate_with(audit)
    clerk = smolagents.ToolCallingAgent(tools=[charge], model=ScriptedSmolModel([
        ("charge", {"amount": 1}), ("charge", {"amount": 2}), ("final_answer", {"answer": "paid"}),
    ]), name="clerk", description="Pays.")
    govern(clerk, gate)
    manager = smolagents.CodeAgent(tools=[charge], model=ScriptedSmolModel([
        code("r = clerk(task='pay twice')\ntry:\n    charge(3)\nexcept BudgetExceeded:\n    r += ' / refused'\n"
             "final_answer(r)"),
    ]), managed_agents=[clerk])
    govern(manager, gate, sandbox="process")
    try:
        assert "refused" in str(manager.run("pay"))
    finally:
        manager.cleanup()
    assert [r["amount"] for _, r in RAN] == [1, 2]
    assert len(run_ids(audit)) == 1
    assert [r.get("agent") for r in audit.of_kind("call_intent") if r["tool"] == "charge"] == ["clerk", "clerk", None]
    assert [r["status"] for r in audit.of_kind("run_finished")] == ["done"]


def test_a_governed_tool_calling_run_stopped_at_max_steps_says_so() -> None:
    audit = InMemoryAudit()
    agent = smolagents.ToolCallingAgent(tools=[charge], model=ScriptedSmolModel([
        ("charge", {"amount": 1}), "I ran out of steps.",
    ]), max_steps=1)
    govern(agent, gate_with(audit))
    agent.run("pay")
    assert [r["status"] for r in audit.of_kind("run_finished")] == ["max_steps"]
