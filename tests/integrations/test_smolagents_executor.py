"""GovernedExecutor and govern_tools: smolagents agents governed by proctor, unchanged otherwise."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import smolagents
from smolagents import tool
from smolagents.agents import ActionStep

from integrations.smol_tools import CALLS, ScriptedSmolModel, Summer, get_weather
from proctor import Gate, Policy, ToolDenied
from proctor.errors import ConfigurationError
from proctor.integrations.smolagents import GovernedExecutor, govern_tools
from proctor.interpreter.result import ProgramError
from proctor.testing import InMemoryAudit

POLICY_DATA: dict[str, Any] = {
    "version": 1,
    "default": "deny",
    "tools": {"get_weather": {"side_effect": "read"}, "summer": {"side_effect": "write"},
              "final_answer": {"side_effect": "none"}},
    "rules": [
        {"name": "reads", "match": {"side_effect": ["none", "read"]}, "decision": "allow"},
        {"name": "small-sums", "match": {"tool": "summer"}, "when": "args.a < 100", "decision": "allow"},
    ],
}
POLICY = Policy.from_dict(POLICY_DATA)


def code(body: str) -> str:
    return f"Thought: go.\n<code>\n{body}\n</code>"


@pytest.fixture
def audit() -> InMemoryAudit:
    return InMemoryAudit()


@pytest.fixture
def executor(audit: InMemoryAudit) -> Iterator[GovernedExecutor]:
    ex = GovernedExecutor(Gate(POLICY, audit=audit), sandbox="process", timeout=20)
    yield ex
    ex.cleanup()


def observations(agent: Any) -> list[str]:
    return [s.observations or "" for s in agent.memory.steps if isinstance(s, ActionStep)]


def errors(agent: Any) -> list[str]:
    return [str(s.error) for s in agent.memory.steps if isinstance(s, ActionStep) and s.error]


def test_code_agent_runs_through_the_gate_with_state_logs_and_final_answer(
        executor: GovernedExecutor, audit: InMemoryAudit) -> None:
    """Tool calls are gated and audited, variables survive steps, prints are observed, final_answer ends the run."""
    CALLS.clear()
    model = ScriptedSmolModel([
        code("w = get_weather('Oslo')\nprint('weather:', w)"),
        code("total = summer(1, [2, 3])\nfinal_answer(f'{w}; {total}')"),
    ])
    agent = smolagents.CodeAgent(tools=[get_weather, Summer()], model=model, executor=executor)
    assert agent.run("weather and sum") == "sunny in Oslo; 6.0"
    assert "weather: sunny in Oslo" in observations(agent)[0]
    assert [name for name, _ in CALLS] == ["get_weather", "summer"]
    intents = [r for r in audit.records if r["kind"] == "call_intent"]
    assert [r["tool"] for r in intents] == ["get_weather", "summer"]


def test_a_refusal_becomes_an_observation_the_model_reads(executor: GovernedExecutor) -> None:
    """A denied call raises inside the program; smolagents records the refusal as the step's error."""
    CALLS.clear()
    model = ScriptedSmolModel([
        code("summer(500, [1])"),
        code("final_answer('gave up')"),
    ])
    agent = smolagents.CodeAgent(tools=[Summer()], model=model, executor=executor)
    assert agent.run("big sum") == "gave up"
    assert CALLS == []
    assert "ToolDenied" in errors(agent)[0] and "summer(500, [1])" in errors(agent)[0]
    second_prompt = str(model.seen[1])
    assert "ToolDenied" in second_prompt


def test_the_last_value_and_errors_match_smolagents(executor: GovernedExecutor) -> None:
    """The executor returns CodeOutput like smolagents' own, and raises program errors for smolagents to observe."""
    executor.send_tools({"final_answer": smolagents.FinalAnswerTool()})
    out = executor("x = 3\nprint('hi')\nx += 1")
    assert (out.output, out.logs, out.is_final_answer) == (4, "hi\n", False)
    assert executor("x * 10").output == 40
    out = executor("final_answer(x)")
    assert (out.output, out.is_final_answer) == (4, True)
    with pytest.raises(ProgramError, match=r"ZeroDivisionError: division by zero \(line 2: y = 1 / 0\)"):
        executor("print('before')\ny = 1 / 0")
    assert executor.state["_print_outputs"] == "before\n"


def test_send_variables_gives_data_and_reprs(executor: GovernedExecutor) -> None:
    """Variables arrive as data; an object that is not data arrives as its repr."""

    class Thing:
        def __repr__(self) -> str:
            return "<thing>"

    executor.send_tools({})
    executor.send_variables({"n": 3, "xs": [1, 2.5, None], "cfg": {"a": (1, 2), "b": {3}}, "thing": Thing(),
                             "inf": float("inf")})
    out = executor("(n + len(xs), cfg['a'][1], 3 in cfg['b'], thing, inf > 10**9)")
    assert list(out.output) == [6, 2, True, "<thing>", True]
    with pytest.raises(ConfigurationError, match="not a plain Python identifier"):
        executor.send_variables({"__builtins__": 1})


def test_send_tools_with_new_tools_keeps_the_variables(executor: GovernedExecutor) -> None:
    """A changed tool set starts a fresh worker, which gets the variables sent before."""
    executor.send_tools({"get_weather": get_weather})
    executor.send_variables({"city": "Bergen"})
    assert executor("get_weather(city)").output == "sunny in Bergen"
    executor.send_tools({"get_weather": get_weather, "summer": Summer()})
    assert executor("summer(1, [1]) and city").output == "Bergen"


def test_a_custom_final_answer_tool_shapes_the_answer_through_the_gate(audit: InMemoryAudit) -> None:
    """A final_answer tool other than smolagents' own runs (governed) and its result is the answer."""

    class ShoutingFinalAnswer(smolagents.FinalAnswerTool):
        def forward(self, answer: Any) -> Any:
            return str(answer).upper() + "!"

    executor = GovernedExecutor(Gate(POLICY, audit=audit), sandbox="process")
    try:
        model = ScriptedSmolModel([code("final_answer('done')")])
        agent = smolagents.CodeAgent(tools=[], model=model, executor=executor)
        agent.tools["final_answer"] = ShoutingFinalAnswer()
        assert agent.run("finish") == "DONE!"
        intents = [r for r in audit.records if r["kind"] == "call_intent"]
        assert [r["tool"] for r in intents] == ["final_answer"]
    finally:
        executor.cleanup()


def test_a_refused_custom_final_answer_is_not_an_answer() -> None:
    """When the policy refuses the final_answer tool, the program fails and the run does not end there."""

    class Custom(smolagents.FinalAnswerTool):
        def forward(self, answer: Any) -> Any:
            return answer

    executor = GovernedExecutor(Gate(Policy.from_dict({"version": 1, "default": "deny"})), sandbox="process")
    try:
        executor.send_tools({"final_answer": Custom()})
        with pytest.raises(ProgramError, match="ToolDenied"):
            executor("final_answer(1)")
    finally:
        executor.cleanup()


def test_each_agent_run_is_a_run_at_the_gate(executor: GovernedExecutor) -> None:
    """send_tools (called by every agent.run) opens a fresh gate run: its own history and budgets."""
    executor.send_tools({"get_weather": get_weather})
    executor("get_weather('A')")
    first = executor._context
    executor.send_tools({"get_weather": get_weather})
    assert executor._context is not first and executor._context is not None
    assert first is not None and len(first.records) == 1
    assert len(executor._context.records) == 0


def test_a_missing_authorized_import_is_refused_when_the_executor_is_built() -> None:
    """As smolagents' own executor, naming an uninstalled module fails at construction."""
    with pytest.raises(ConfigurationError, match="not installed"):
        GovernedExecutor(Gate(POLICY), authorized_imports=["surely_not_installed_pkg"])


def test_govern_tools_gives_tool_calling_agents_gated_tools() -> None:
    """ToolCallingAgent calls the governed tools; allowed calls run, refused ones come back as errors."""
    CALLS.clear()
    gate = Gate(POLICY)
    tools = govern_tools([get_weather, Summer()], gate)
    assert [t.name for t in tools] == ["get_weather", "summer"]
    assert tools[1].inputs == Summer.inputs and tools[0].output_type == "string"
    model = ScriptedSmolModel([
        ("get_weather", {"city": "Rome"}),
        ("summer", {"a": 1000, "xs": [1]}),
        ("final_answer", {"answer": "ok"}),
    ])
    agent = smolagents.ToolCallingAgent(tools=tools, model=model)
    assert agent.run("go") == "ok"
    assert [name for name, _ in CALLS] == ["get_weather"]
    assert any("ToolDenied" in e for e in errors(agent))
    assert [r.status for r in gate.default_context().records] == ["ok", "denied"]
    with pytest.raises(ToolDenied):
        tools[1](a=1000, xs=[])


def test_govern_tools_and_the_executor_compose_on_one_gate(audit: InMemoryAudit) -> None:
    """Tools governed for a ToolCallingAgent can be handed to a CodeAgent governed on the same gate: one tool each."""
    CALLS.clear()
    gate = Gate(POLICY, audit=audit)
    tools = govern_tools([get_weather, Summer()], gate)
    model = ScriptedSmolModel([code("w = get_weather('Oslo')\nfinal_answer(w + ' ' + str(summer(1, [2])))")])
    agent = smolagents.CodeAgent(tools=tools, model=model, executor=GovernedExecutor(gate, sandbox="process"))
    try:
        assert agent.run("go") == "sunny in Oslo 3.0"
    finally:
        agent.cleanup()
    assert [name for name, _ in CALLS] == ["get_weather", "summer"]
    assert errors(agent) == []
    assert [r["tool"] for r in audit.of_kind("call_intent")] == ["get_weather", "summer"]


def test_a_real_tool_name_conflict_is_an_error_before_the_model_is_asked() -> None:
    """Two different tools of one name on the gate: ConfigurationError from agent.run, not an observation."""

    @tool
    def get_weather(city: str) -> str:
        """Another weather tool.

        Args:
            city: The city.
        """
        return "rain"

    gate = Gate(POLICY)
    govern_tools([Summer()], gate)
    from integrations.smol_tools import get_weather as registered

    gate.register(registered)
    model = ScriptedSmolModel([code("final_answer(get_weather('x'))")])
    agent = smolagents.CodeAgent(tools=[get_weather], model=model, executor=GovernedExecutor(gate, sandbox="process"))
    try:
        with pytest.raises(ConfigurationError, match="a different tool named 'get_weather' is already registered"):
            agent.run("go")
        assert model.seen == []
    finally:
        agent.cleanup()
    other = govern_tools([Summer()], Gate(POLICY))
    agent = smolagents.CodeAgent(tools=other, model=model, executor=GovernedExecutor(gate, sandbox="process"))
    try:
        with pytest.raises(ConfigurationError, match="governed on another gate"):
            agent.run("go")
    finally:
        agent.cleanup()


def test_an_executor_given_a_policy_path_reloads_it_as_a_gate_does(tmp_path: Any) -> None:
    """A policy file replaced during the agent's run: the next program's calls are decided by the new file, the
    change is audited with both fingerprints; a bad file in between is refused with its located error and the
    old policy keeps deciding."""
    import os

    import yaml

    from proctor.policy.reload import PolicyRefused

    data = POLICY_DATA
    closed = {**data, "rules": [{"name": "closed", "match": {"tool": "get_weather"}, "decision": "deny",
                                 "reason": "no forecasts today"}, *data["rules"]]}
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(data))
    first, second = Policy.from_yaml(path), Policy.from_dict(closed)
    audit = InMemoryAudit()
    executor = GovernedExecutor(str(path), audit=audit, sandbox="process", timeout=20)
    source = executor.policy_source
    assert source is not None and executor.policy.sha256 == first.sha256
    refusals: list[PolicyRefused] = []
    source.on_refused = refusals.append

    def replace(text: str) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)

    class Deploying(ScriptedSmolModel):
        """Replaces the policy file before its second and third answers."""

        def generate(self, messages: Any, stop_sequences: Any = None, response_format: Any = None,
                     tools_to_call_from: Any = None, **kwargs: Any) -> Any:
            if len(self.seen) == 1:
                replace(yaml.safe_dump(closed).replace("decision: deny", "decision: dney"))
                assert source.reload() is False
            elif len(self.seen) == 2:
                replace(yaml.safe_dump(closed))
                assert source.reload() is True
            return super().generate(messages, stop_sequences, response_format, tools_to_call_from, **kwargs)

    ask = "try:\n    print('weather:', get_weather('Oslo'))\nexcept Exception as exc:\n    print('refused:', exc)"
    model = Deploying([code(ask), code(ask), code(ask), code("final_answer('done')")])
    agent = smolagents.CodeAgent(tools=[get_weather], model=model, executor=executor)
    try:
        assert agent.run("weather, three times") == "done"
    finally:
        executor.cleanup()
    seen = observations(agent)
    assert ["weather: sunny in Oslo" in o for o in seen[:3]] == [True, True, False]
    assert "refused: get_weather: denied: no forecasts today" in seen[2]
    (refused,) = refusals
    assert refused.message.startswith(f"{path}:") and "dney" in refused.message
    intents = [(r["decision"], r["policy_sha256"]) for r in audit.records
               if r["kind"] == "call_intent" and r["tool"] == "get_weather"]
    assert intents == [("allow", first.sha256), ("allow", first.sha256), ("deny", second.sha256)]
    assert [(r["old_sha256"], r["new_sha256"]) for r in audit.of_kind("policy_changed")] == [
        (first.sha256, second.sha256)]
