"""Tools from smolagents' own ``MCPClient`` keep their MCP annotations, read as hints (as MCPToolset reads them).

Against the npm reference filesystem server (npx), through smolagents' real ``MCPClient``. mcpadapt,
which the client is built on, imports names the mcp SDK 2.x no longer has: these tests run in the
mcp 1.x venv (``make test-mcp1``) and are skipped where mcpadapt does not import.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcpadapt.core", exc_type=ImportError,
                    reason="smolagents' MCPClient needs mcpadapt, which needs the mcp SDK 1.x: make test-mcp1")

import smolagents  # after the skip: nothing here works without mcpadapt
from mcp import StdioServerParameters
from smolagents import MCPClient

from integrations.smol_tools import ScriptedSmolModel
from proctor import Gate, Policy
from proctor.errors import ConfigurationError
from proctor.integrations.smolagents import GovernedExecutor, govern_tools, mcp_client_tools
from proctor.testing import InMemoryAudit

pytestmark = [pytest.mark.server]

READS = {"version": 1, "default": "deny",
         "rules": [{"name": "reads", "match": {"side_effect": "read"}, "decision": "allow"},
                   {"name": "answers", "match": {"tool": "final_answer"}, "decision": "allow"}]}


@pytest.fixture
def data(tmp_path: Path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "note.txt").write_text("the note\n")
    return folder


@pytest.fixture
def client(data: Path) -> Iterator[Any]:
    server = StdioServerParameters(command="npx", args=["-y", "@modelcontextprotocol/server-filesystem", str(data)])
    # mcpadapt waits 5 s for each request by default, which npx's first start on a busy machine exceeds.
    mcp = MCPClient(server, structured_output=False,
                    adapter_kwargs={"connect_timeout": 120, "client_session_timeout_seconds": 60.0})
    try:
        yield mcp
    finally:
        mcp.disconnect()


def test_the_clients_tools_keep_their_annotations_and_are_destructive_unless_trusted(client: Any) -> None:
    tools = {t.name: t for t in mcp_client_tools(client, name="files")}
    assert {"read_text_file", "write_file", "create_directory"} <= set(tools)
    # What the server said, recovered (mcpadapt's tools have lost it) ...
    assert tools["read_text_file"].annotations == {"readOnlyHint": True, "openWorldHint": False}
    assert tools["write_file"].annotations["destructiveHint"] is True
    # ... and read as hints: every tool destructive, every one naming its server.
    assert {t.side_effect for t in tools.values()} == {"destructive"}
    assert {t.origin for t in tools.values()} == {"mcp:files"}
    trusted = {t.name: t.side_effect for t in mcp_client_tools(client, name="files", trust_annotations=True)}
    assert trusted["read_text_file"] == "read"
    assert trusted["write_file"] == "destructive"
    assert trusted["create_directory"] == "write"  # destructiveHint and openWorldHint both false


def test_a_governed_tool_calling_agent_calls_them_through_the_gate(client: Any, data: Path) -> None:
    """Untrusted, a read is denied under a reads-allowed policy; declared in the policy's tools:, it runs."""
    audit = InMemoryAudit()
    gate = Gate(Policy.from_dict(READS), audit=audit)
    note = str(data / "note.txt")
    model = ScriptedSmolModel([("read_text_file", {"path": note}), ("final_answer", {"answer": "denied"})])
    agent = smolagents.ToolCallingAgent(tools=govern_tools(mcp_client_tools(client, name="files"), gate),
                                        model=model, max_steps=3)
    assert agent.run("read the note") == "denied"
    assert [(r["tool"], r["status"]) for r in audit.of_kind("call_outcome")] == [("read_text_file", "denied")]

    declared = Gate(Policy.from_dict({**READS, "tools": {"read_text_file": {"side_effect": "read"}}}), audit=audit)
    model = ScriptedSmolModel([("read_text_file", {"path": note}), ("final_answer", {"answer": "read"})])
    agent = smolagents.ToolCallingAgent(tools=govern_tools(mcp_client_tools(client, name="files"), declared),
                                        model=model, max_steps=3)
    assert agent.run("read the note") == "read"
    assert (audit.of_kind("call_outcome")[-1]["tool"], audit.of_kind("call_outcome")[-1]["status"]) == \
        ("read_text_file", "ok")


def test_trusted_annotations_let_reads_run_and_keep_writes_out(client: Any, data: Path) -> None:
    """trust_annotations=True, in a CodeAgent with the governed executor: the read runs, the write is denied."""
    audit = InMemoryAudit()
    gate = Gate(Policy.from_dict(READS), audit=audit)
    tools = govern_tools(mcp_client_tools(client, name="files", trust_annotations=True), gate)
    program = (f"text = read_text_file(path={str(data / 'note.txt')!r})\n"
               f"try:\n    write_file(path={str(data / 'out.txt')!r}, content='x')\nexcept ToolDenied:\n"
               "    text += ' (write denied)'\nfinal_answer(text)")
    executor = GovernedExecutor(gate, sandbox="process")
    try:
        model = ScriptedSmolModel([f"Thought: go.\n<code>\n{program}\n</code>"])
        agent = smolagents.CodeAgent(tools=tools, model=model, executor=executor)
        answer = agent.run("read")
    finally:
        executor.cleanup()
    assert "the note" in str(answer) and "(write denied)" in str(answer)
    assert not (data / "out.txt").exists()
    outcomes = [(r["tool"], r["status"]) for r in audit.of_kind("call_outcome")]
    assert outcomes == [("read_text_file", "ok"), ("write_file", "denied")]


def test_anything_but_an_mcp_client_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"takes a smolagents MCPClient, not a list"):
        mcp_client_tools([])
