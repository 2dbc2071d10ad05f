"""MCPToolset: a real FastMCP server's tools, over stdio and streamable HTTP, governed like any other."""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import StdioServerParameters

from proctor import CodeAgent, Gate, Interpreter, Policy, ScriptedModel, ToolDenied, ToolFailed
from proctor.errors import ConfigurationError, ToolOutcomeUnknown, ToolsetError
from proctor.integrations.mcp import MCPToolset
from proctor.testing import InMemoryAudit

SERVER = Path(__file__).with_name("mcp_server.py")
POLICY = Policy.from_dict({
    "version": 1,
    "default": "deny",
    # Servers choose nothing: ops declare the classes (an MCP tool is destructive otherwise).
    "tools": {"explode": {"side_effect": "read"}, "get_weather": {"side_effect": "read"},
              "add": {"side_effect": "write"}, "get_stats": {"side_effect": "write"},
              "fetch_url": {"side_effect": "external"}},
    "rules": [
        {"name": "reads", "match": {"side_effect": ["none", "read"]}, "decision": "allow"},
        {"name": "writes", "match": {"side_effect": "write"}, "decision": "allow"},
    ],
})


def stdio(log: Path) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[str(SERVER), "stdio", "-", str(log)])


def ran(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def test_tools_keep_their_schema_and_are_destructive_unless_ops_say_otherwise(tmp_path: Path) -> None:
    """inputSchema is the schema; annotations are hints a toolset ignores unless told to trust the server."""
    with MCPToolset(stdio(tmp_path / "log")) as tools:
        by_name = {t.name: t for t in tools}
        assert set(by_name) == {"get_weather", "delete_file", "fetch_url", "add", "get_stats", "explode",
                                "wipe_disk", "slow_write", "die", "huge", "ship"}
        assert {t.side_effect for t in tools} == {"destructive"}
        weather = by_name["get_weather"]
        assert weather.parameters["required"] == ["city"]
        assert weather.parameters["properties"]["city"]["type"] == "string"
        assert weather.description == "Tell the weather in a city."
        assert str(weather.signature) == "(city: str, units: str = 'metric') -> str"
        assert weather.origin is not None and weather.origin.startswith("mcp:")
        # The policy's `tools:` section is what decides: wipe_disk's readOnlyHint does not make it a read.
        gate = Gate(POLICY, tools=tools)
        with pytest.raises(ToolDenied, match="no rule matched"):
            gate.call("wipe_disk", {"disk": "sda"})


def test_trust_annotations_reads_them_with_the_specs_defaults(tmp_path: Path) -> None:
    """Trusting a server: readOnlyHint -> read, else destructiveHint (default true), else openWorldHint."""
    with MCPToolset(stdio(tmp_path / "log"), trust_annotations=True) as tools:
        classes = {t.name: t.side_effect for t in tools}
    assert classes["get_weather"] == "read"
    assert classes["delete_file"] == "destructive"
    assert classes["fetch_url"] == "external"
    assert classes["add"] == "destructive"  # no annotations: MCP's defaults are destructive, open-world


def test_calls_go_through_the_gate_and_arguments_are_validated(tmp_path: Path) -> None:
    """Allowed calls reach the server; refused ones and ones that do not fit the schema never do."""
    log = tmp_path / "log"
    audit = InMemoryAudit()
    with MCPToolset(stdio(log)) as tools:
        gate = Gate(POLICY, audit=audit, tools=tools)
        assert gate.call("get_weather", {"city": "Oslo"}) == "sunny in Oslo (metric)"
        assert gate.call("add", {"a": 2, "b": 3}) == 5
        assert gate.call("get_stats", {"values": [1, 2, 3]}) == {"sum": 6.0, "mean": 2.0}
        with pytest.raises(ToolDenied, match="no rule matched"):
            gate.call("delete_file", {"path": "/etc/passwd"})
        with pytest.raises(ToolDenied, match=r"argument 'a'.*is not of type 'integer'"):
            gate.call("add", {"a": "two", "b": 3})
        with pytest.raises(ToolDenied, match="unexpected argument 'c'"):
            gate.call("add", {"a": 1, "b": 2, "c": 3})
        with pytest.raises(ToolFailed, match="kaboom"):
            gate.call("explode", {"message": "kaboom"})
    assert ran(log) == ["get_weather", "add", "get-stats"]
    outcomes = [(r["tool"], r["status"]) for r in audit.of_kind("call_outcome")]
    assert outcomes == [("get_weather", "ok"), ("add", "ok"), ("get_stats", "ok"), ("delete_file", "denied"),
                        ("add", "denied"), ("add", "denied"), ("explode", "failed")]
    failed = audit.of_kind("call_outcome")[-1]
    assert "explode (MCP server" in failed["error"] and "kaboom" in failed["error"]


def test_programs_call_mcp_tools_inside_the_sandbox(tmp_path: Path) -> None:
    """An interpreter program calls MCP tools by their Python names; each call is a gate record."""
    with MCPToolset(stdio(tmp_path / "log")) as tools, \
            Interpreter(tools, Gate(POLICY), sandbox="process") as py:
        r = py.run("s = get_stats([2, 4])\nw = get_weather('Rome', units='imperial')\n(s['mean'], w)")
    assert r.error is None, r.error
    assert list(r.value) == [3.0, "sunny in Rome (imperial)"]
    assert [c.tool for c in r.tool_calls] == ["get_stats", "get_weather"]


def test_a_code_agent_runs_with_mcp_tools(tmp_path: Path) -> None:
    """CodeAgent takes the toolset's tools as they are."""
    model = ScriptedModel(["```python\nfinal_answer(add(20, 22))\n```"])
    with MCPToolset(stdio(tmp_path / "log")) as tools, \
            CodeAgent(tools, model, POLICY, sandbox="process") as agent:
        assert agent.run("add").answer == 42


# -- the session's event loop: run by the thread making a call, shared by concurrent ones ------------------

ALLOW_ALL = Policy.from_dict({"version": 1, "default": "allow"})


def test_calls_from_two_threads_at_once_run_side_by_side(tmp_path: Path) -> None:
    """While one thread's call waits on the server, another thread's call to it is answered."""
    log, target = tmp_path / "log", tmp_path / "written"
    ended: dict[str, Any] = {}
    with MCPToolset(stdio(log)) as tools:
        gate = Gate(ALLOW_ALL, tools=tools)

        def slow() -> None:
            ended["slow"] = gate.call("slow_write", {"path": str(target), "seconds": 4})

        thread = threading.Thread(target=slow)
        thread.start()
        time.sleep(0.5)  # the slow call is on its way (or about to be): either way the two overlap
        assert gate.call("add", {"a": 1, "b": 2}) == 3
        assert "slow" not in ended and not target.exists()  # answered while the slow call was in flight
        assert gate.call("get_weather", {"city": "Oslo"}) == "sunny in Oslo (metric)"
        thread.join(30)
        assert ended["slow"] == "written"
        assert gate.call("add", {"a": 2, "b": 2}) == 4  # and after it, from this thread again
    assert ran(log) == ["add", "get_weather", "slow_write", "add"]


def test_calls_from_inside_a_running_event_loop_and_after_a_pause(tmp_path: Path) -> None:
    """Synchronous code running on an event loop of its own can call a tool; so can code that paused."""
    with MCPToolset(stdio(tmp_path / "log")) as tools:
        gate = Gate(ALLOW_ALL, tools=tools)

        async def inside() -> Any:
            return gate.call("add", {"a": 20, "b": 22})

        assert asyncio.run(inside()) == 42
        assert gate.call("add", {"a": 1, "b": 1}) == 2
        time.sleep(0.3)  # long enough for the toolset's own thread to run the session again
        assert gate.call("add", {"a": 3, "b": 4}) == 7
        answers: list[Any] = []

        def add_one(a: int) -> None:
            answers.append(gate.call("add", {"a": a, "b": 1}))

        workers = [threading.Thread(target=add_one, args=(i,)) for i in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(30)
        assert sorted(answers) == [1, 2, 3, 4]


def test_closing_the_toolset_during_another_threads_call_ends_it_as_unknown(tmp_path: Path) -> None:
    """The call in flight when the session ends says it may have taken effect; nothing hangs."""
    log, target = tmp_path / "log", tmp_path / "written"
    audit = InMemoryAudit()
    failed: list[BaseException] = []
    toolset = MCPToolset(stdio(log), name="files")
    gate = Gate(ALLOW_ALL, audit=audit, tools=toolset.open())

    def slow() -> None:
        try:
            gate.call("slow_write", {"path": str(target), "seconds": 5})
        except ToolFailed as exc:
            failed.append(exc)

    thread = threading.Thread(target=slow)
    thread.start()
    time.sleep(1)
    toolset.close()
    thread.join(30)
    assert not thread.is_alive()
    assert len(failed) == 1 and "may have taken effect" in str(failed[0])
    assert [o["status"] for o in audit.of_kind("call_outcome")] == ["unknown"]
    with pytest.raises(ToolFailed, match="the MCP session is closed"):
        gate.call("add", {"a": 1, "b": 2})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The same server over streamable HTTP on a random localhost port."""
    yield from _served("http", tmp_path)


@pytest.fixture(params=["http", "http-json"])
def both_http_servers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The same server answering as SSE streams, and as JSON bodies."""
    yield from _served(request.param, tmp_path)


def _served(mode: str, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    port, log = _free_port(), tmp_path / "log"
    proc = subprocess.Popen([sys.executable, str(SERVER), mode, str(port), str(log)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"the MCP test server died: {proc.stderr.read() if proc.stderr else ''}") from None
            time.sleep(0.1)
    try:
        yield f"http://127.0.0.1:{port}/mcp", log
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stderr:
            proc.stderr.close()


def test_streamable_http_server_tools_are_governed(http_server: tuple[str, Path]) -> None:
    """Over streamable HTTP, the same tools, the same gate."""
    url, log = http_server
    with MCPToolset(url) as tools:
        gate = Gate(POLICY, tools=tools)
        assert gate.call("get_weather", {"city": "Lima"}) == "sunny in Lima (metric)"
        with pytest.raises(ToolDenied):
            gate.call("fetch_url", {"url": "http://example.com"})
    assert ran(log) == ["get_weather"]


def test_an_http_answer_past_max_message_bytes_closes_the_session_saying_why(
        both_http_servers: tuple[str, Path]) -> None:
    """An answer is bounded as it is read, as an SSE event or as a JSON body (which the SDK reads whole, however long):
    past `max_message_bytes`, the call is an unknown outcome saying why, at once, and the session is closed."""
    url, _ = both_http_servers
    started = time.monotonic()
    with MCPToolset(url, name="big", max_message_bytes=1 << 20, call_timeout=60) as tools:
        gate = Gate(Policy.from_dict({"version": 1, "default": "allow"}), tools=tools)
        assert len(gate.call("huge", {"megabytes": 0})) == 0  # within it: answered
        with pytest.raises(ToolOutcomeUnknown) as info:
            gate.call("huge", {"megabytes": 40})
        with pytest.raises(ToolFailed, match=r"the MCP session is closed"):
            gate.call("add", {"a": 1, "b": 2})
    assert time.monotonic() - started < 30
    assert re.fullmatch(r"huge: huge \(MCP server big\): the server sent an (answer|event) of more than 1048576 bytes "
                        r"\(max_message_bytes=1048576\); proctor closed the session; the call may have taken effect",
                        str(info.value)), str(info.value)


def test_a_server_that_cannot_start_is_a_toolset_error(tmp_path: Path) -> None:
    """A command that is no MCP server fails loudly, naming the server."""
    bad = StdioServerParameters(command=sys.executable, args=["-c", "import sys; sys.exit(3)"])
    with pytest.raises(ToolsetError, match="the MCP server"):
        MCPToolset(bad, timeout=20).open()
    with pytest.raises(ConfigurationError, match="http:// or https://"):
        MCPToolset("ftp://host/mcp")
