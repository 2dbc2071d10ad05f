"""MCPToolset tools handed to a smolagents agent: governed, with the signatures the schemas give."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import smolagents
from mcp import StdioServerParameters

from integrations.smol_tools import ScriptedSmolModel
from proctor import Gate, Policy
from proctor.integrations.mcp import MCPToolset
from proctor.testing import InMemoryAudit

# Servers over stdio, and smolagents programs in proctor's sandboxed worker.
pytestmark = [pytest.mark.server, pytest.mark.sandbox]

SERVER = Path(__file__).with_name("mcp_server.py")
POLICY = Policy.from_dict({
    "version": 1, "default": "deny",
    "tools": {"add": {"side_effect": "read"}, "get_weather": {"side_effect": "read"}},
    "rules": [{"name": "reads", "match": {"side_effect": "read"}, "decision": "allow"}],
})


def test_a_smolagents_agent_takes_the_toolsets_tools_and_every_call_is_governed(tmp_path: Path) -> None:
    """smolagents_tools(gate) are smolagents tools; each call goes through the gate (the annotations a
    server claims change nothing: wipe_disk says readOnlyHint and is still denied)."""
    log = tmp_path / "log"
    audit = InMemoryAudit()
    gate = Gate(POLICY, audit=audit)
    server = StdioServerParameters(command=sys.executable, args=[str(SERVER), "stdio", "-", str(log)])
    toolset = MCPToolset(server, name="test")
    with toolset:
        tools = toolset.smolagents_tools(gate)
        assert all(isinstance(t, smolagents.Tool) for t in tools)
        model = ScriptedSmolModel([("wipe_disk", {"disk": "sda"}), ("add", {"a": 20, "b": 22}),
                                   ("final_answer", {"answer": "42"})])
        agent = smolagents.ToolCallingAgent(tools=tools, model=model, max_steps=4)
        assert agent.run("add") == "42"
    assert (log.read_text().split() if log.exists() else []) == ["add"]
    outcomes = [(r["tool"], r["status"]) for r in audit.of_kind("call_outcome")]
    assert outcomes == [("wipe_disk", "denied"), ("add", "ok")]


def test_a_smolagents_code_agent_with_the_governed_executor_takes_them_too(tmp_path: Path) -> None:
    """smolagents.CodeAgent(tools=toolset.smolagents_tools(gate), executor=GovernedExecutor(gate)): one gate."""
    from proctor.integrations.smolagents import GovernedExecutor

    log = tmp_path / "log"
    audit = InMemoryAudit()
    gate = Gate(POLICY, audit=audit)
    server = StdioServerParameters(command=sys.executable, args=[str(SERVER), "stdio", "-", str(log)])
    toolset = MCPToolset(server, name="test")
    with toolset:
        model = ScriptedSmolModel(["Thought: go.\n<code>\ntry:\n    wipe_disk('sda')\nexcept Exception as e:\n"
                                   "    print(type(e).__name__)\nfinal_answer(add(20, 22))\n</code>"])
        executor = GovernedExecutor(gate)
        try:
            agent = smolagents.CodeAgent(tools=toolset.smolagents_tools(gate), model=model, executor=executor)
            assert agent.run("add") == 42
        finally:
            executor.cleanup()
    assert (log.read_text().split() if log.exists() else []) == ["add"]
    outcomes = [(r["tool"], r["status"]) for r in audit.of_kind("call_outcome")]
    assert ("wipe_disk", "denied") in outcomes and ("add", "ok") in outcomes
