"""A governed smolagents run is told truthfully: one trace with run and step spans, step numbers, how it
ended (``max_steps``), a log closed cleanly at interpreter exit, and the agent's own authorized imports."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import smolagents
from openinference.instrumentation.smolagents import SmolagentsInstrumentor

from integrations.smol_tools import ScriptedSmolModel, get_weather
from proctor import Gate, Policy
from proctor.integrations.smolagents import GovernedExecutor, govern_tools
from proctor.testing import InMemoryAudit, SpanCapture

POLICY: dict[str, Any] = {
    "version": 1, "default": "deny",
    "tools": {"get_weather": {"side_effect": "read"}, "final_answer": {"side_effect": "none"}},
    "rules": [{"name": "reads", "match": {"side_effect": ["none", "read"]}, "decision": "allow"}],
}


def code(body: str) -> str:
    return f"Thought: go.\n<code>\n{body}\n</code>"


def test_one_trace_per_run_with_run_and_step_spans_and_the_right_step_numbers() -> None:
    audit, capture = InMemoryAudit(), SpanCapture()
    gate = Gate(Policy.from_dict(POLICY), audit=audit, tracer=capture.tracer)
    model = ScriptedSmolModel([
        code("a = get_weather('Oslo')\nb = get_weather('Rome')"),
        "no code in this reply: smolagents counts it as a step that failed to parse",
        code("final_answer(get_weather('Bergen'))"),
    ])
    agent = smolagents.CodeAgent(tools=[get_weather], model=model, executor=GovernedExecutor(gate, sandbox="process"),
                                 name="planner")
    try:
        assert agent.run("weather") == "sunny in Bergen"
    finally:
        agent.cleanup()
    tools = capture.spans("execute_tool")
    assert len(tools) == 3
    assert len({s.context.trace_id for s in capture.spans()}) == 1  # one trace, not one per call
    (run,) = capture.spans("invoke_agent")
    assert run.name == "invoke_agent planner"
    steps = {s.attributes["proctor.step"]: s for s in capture.spans("step ")}
    assert sorted(steps) == [1, 3]  # the steps that ran a program; step 2 had none
    assert all(steps[n].parent is not None and steps[n].parent.span_id == run.context.span_id for n in steps)
    for span in tools:
        assert span.parent is not None and span.parent.span_id in {s.context.span_id for s in steps.values()}
    assert [r["step"] for r in audit.of_kind("call_intent")] == [1, 1, 3]
    assert [s.attributes["proctor.run.step"] for s in tools] == [1, 1, 3]
    records = audit.of_kind("step")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert [len(r["call_ids"]) for r in records] == [2, 0, 1]
    (finished,) = audit.of_kind("run_finished")
    assert finished["status"] == "done" and finished["steps"] == 3


def test_run_finished_says_max_steps_when_smolagents_stopped_there() -> None:
    audit = InMemoryAudit()
    model = ScriptedSmolModel([code("get_weather('A')"), code("get_weather('B')"), "my best guess: sunny"])
    agent = smolagents.CodeAgent(tools=[get_weather], model=model, max_steps=2,
                                 executor=GovernedExecutor(Gate(Policy.from_dict(POLICY), audit=audit),
                                                           sandbox="process"))
    try:
        agent.run("weather")
    finally:
        agent.cleanup()
    (finished,) = audit.of_kind("run_finished")
    assert finished["status"] == "max_steps"
    assert audit.kinds().count("run_started") == 1


def test_the_executor_takes_the_agents_additional_authorized_imports() -> None:
    model = ScriptedSmolModel([code("import json\nfinal_answer(json.dumps({'a': 1}))")])
    agent = smolagents.CodeAgent(tools=[], model=model, additional_authorized_imports=["json"],
                                 executor=GovernedExecutor(Gate(Policy.from_dict(POLICY)), sandbox="process"))
    try:
        assert agent.run("json") == '{"a": 1}'
    finally:
        agent.cleanup()


def test_the_audit_log_is_closed_cleanly_at_exit_without_cleanup(tmp_path: Path) -> None:
    """No `agent.cleanup()`: at interpreter exit the run is finished and the log closed, so verify is clean."""
    policy, log = tmp_path / "policy.json", tmp_path / "audit.jsonl"
    policy.write_text(json.dumps(POLICY))
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        import smolagents
        from integrations.smol_tools import ScriptedSmolModel, get_weather
        from proctor.integrations.smolagents import GovernedExecutor

        model = ScriptedSmolModel(["Thought: go.\\n<code>\\nfinal_answer(get_weather('Oslo'))\\n</code>"])
        agent = smolagents.CodeAgent(tools=[get_weather], model=model, executor=GovernedExecutor(
            {str(policy)!r}, audit={str(log)!r}, sandbox="process"))
        print(agent.run("weather"))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "sunny in Oslo" in done.stdout
    verify = subprocess.run([sys.executable, "-m", "proctor.cli", "audit", "verify", str(log), "--json"],
                            capture_output=True, text=True, timeout=120, check=False)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    report = json.loads(verify.stdout)
    assert report["unfinished_runs"] == [] and report["recoveries"] == [] and report["dangling_intents"] == []
    kinds = [json.loads(line)["kind"] for line in log.read_text().splitlines()]
    assert kinds.count("run_started") == kinds.count("run_finished") == 1


def test_with_openinference_on_proctors_spans_nest_under_smolagents_and_no_tool_span_is_doubled() -> None:
    """SmolagentsInstrumentor traces the run, steps and model calls; each tool call has one span, the gate's."""
    capture = SpanCapture()
    instrumentor = SmolagentsInstrumentor()
    instrumentor.instrument(tracer_provider=capture.provider)
    try:
        gate = Gate(Policy.from_dict(POLICY), tracer=capture.tracer)
        model = ScriptedSmolModel([code("a = get_weather('Oslo')"), code("final_answer(get_weather('Rome'))")])
        agent = smolagents.CodeAgent(tools=[get_weather], model=model, name="planner",
                                     executor=GovernedExecutor(gate, sandbox="process"))
        try:
            agent.run("weather")
        finally:
            agent.cleanup()
        governed = govern_tools([get_weather], gate)
        caller = smolagents.ToolCallingAgent(tools=governed, model=ScriptedSmolModel([
            ("get_weather", {"city": "Lima"}), ("final_answer", {"answer": "ok"})]))
        caller.run("weather")
    finally:
        instrumentor.uninstrument()
    spans = capture.spans()
    by_id = {s.context.span_id: s for s in spans}
    tool_spans = [s for s in spans if s.name == "get_weather" or s.name.startswith("execute_tool")]
    assert [s.name for s in tool_spans] == ["execute_tool get_weather"] * 3  # smolagents' TOOL span not doubled
    ours = next(s for s in spans if s.name == "invoke_agent planner")

    def ancestors(span: Any) -> list[str]:
        names = []
        while span.parent is not None and span.parent.span_id in by_id:
            span = by_id[span.parent.span_id]
            names.append(span.name)
        return names

    assert ancestors(ours), "proctor's run span nests under smolagents' own run span"
    for step in (s for s in spans if s.name.startswith("step ")):
        assert "invoke_agent planner" in ancestors(step)
    first_run = {s.context.trace_id for s in spans if "invoke_agent planner" in [s.name, *ancestors(s)]}
    assert len(first_run) == 1
