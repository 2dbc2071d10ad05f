"""MCP servers are untrusted: names, listing limits, lost calls, and the signatures models are shown.

Runs in the dev venv (mcp 2.x) and in `.venv-mcp1` (`make test-mcp1`, mcp 1.x)."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from internal_host import internal_host
from mcp import StdioServerParameters

from proctor import Gate, Interpreter, Policy
from proctor.errors import ConfigurationError, ToolDenied, ToolFailed, ToolsetError
from proctor.integrations.mcp import MCP_MAJOR, MCPTool, MCPToolset
from proctor.signatures import render_signature
from proctor.termsafe import is_invisible
from proctor.testing import InMemoryAudit
from proctor.tools import Tool

HERE = Path(__file__).parent
HOSTILE = HERE / "mcp_hostile.py"
SERVER = HERE / "mcp_server.py"
ALLOW_ALL = Policy.from_dict({"version": 1, "default": "allow"})


def hostile(mode: str, log: Path | None = None) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[str(HOSTILE), mode, *([str(log)] if log else [])])


def fastmcp(log: Path) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[str(SERVER), "stdio", "-", str(log)])


def ran(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def test_the_sdk_under_test_is_the_major_this_venv_pins() -> None:
    """The dev venv runs 2.x, .venv-mcp1 runs 1.x: both majors are really exercised."""
    assert MCP_MAJOR == int(version("mcp").split(".")[0]) and MCP_MAJOR in (1, 2)


def test_an_unsupported_sdk_fails_at_import_naming_the_range(tmp_path: Path) -> None:
    """A later major (here a fake mcp 3.0 distribution first on the path) is refused at import."""
    fake = tmp_path / "mcp-3.0.0.dist-info"
    fake.mkdir()
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: mcp\nVersion: 3.0.0\n")
    out = subprocess.run([sys.executable, "-c", "import proctor.integrations.mcp"], capture_output=True, text=True,
                         env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert out.returncode != 0
    assert "supports the mcp SDK >=1.30,<3" in out.stderr and "mcp 3.0.0 is installed" in out.stderr


@pytest.mark.parametrize(("mode", "message"), [
    ("builtin", r"tool 'print' would be called 'print', which is a Python builtin; give the server's tools a "
                r"prefix: MCPToolset\(\.\.\., prefix="),
    ("dup", r"tool 'get_x' would be called 'get_x', which is also the name of its tool 'get-x'.*prefix="),
    # the errors a program catches are builtins of its sandbox: `except ToolDenied:` must stay the error
    ("errors", r"tool 'ToolDenied' would be called 'ToolDenied', which is a Python builtin.*prefix="),
])
def test_a_server_tool_cannot_take_a_builtins_or_another_tools_name(mode: str, message: str) -> None:
    with pytest.raises(ToolsetError, match=message):
        MCPToolset(hostile(mode), name="hostile").open()


def test_names_taken_by_other_tools_or_agents_are_refused_and_a_prefix_fixes_it() -> None:
    with pytest.raises(ToolsetError, match=r"'plain', which is already taken by another tool or agent.*prefix="):
        MCPToolset(hostile("plain"), reserved={"plain"}).open()
    with MCPToolset(hostile("builtin"), prefix="h_") as tools:
        assert sorted(t.name for t in tools) == ["h_ok_tool", "h_print"]


def test_a_program_print_never_reaches_a_server(tmp_path: Path) -> None:
    """With the prefix, the program's print is Python's; the server's tool is h_print."""
    log = tmp_path / "log"
    with MCPToolset(hostile("builtin", log), prefix="h_") as tools, \
            Interpreter(tools, Gate(ALLOW_ALL), sandbox="process") as py:
        r = py.run("print('the secret is 42')")
    assert r.error is None and "the secret is 42" in r.logs
    assert "tools/call" not in ran(log)


@pytest.mark.parametrize(("mode", "message"), [
    ("pages", r"pages tools/list past 4 pages \(max_pages=4\): the listing was stopped"),
    ("many", r"lists more than 100 tools \(max_tools=100\): the listing was stopped"),
    ("big", r"tool 'huge''s definition is \d+ bytes, over max_schema_bytes=65536"),
    ("slowlist", r"did not list its tools within 3s \(the listing was stopped"),
])
def test_listing_is_bounded(mode: str, message: str, tmp_path: Path) -> None:
    log = tmp_path / "log"
    toolset = MCPToolset(hostile(mode, log), name="hostile", timeout=3, max_pages=4, max_tools=100)
    with pytest.raises(ToolsetError, match=message):
        toolset.open()
    if mode == "pages":  # the listing really stopped: no page is asked for after the limit
        time.sleep(0.5)
        assert ran(log).count("tools/list") == 4


def test_a_timed_out_call_is_cancelled_and_says_its_outcome_is_unknown(tmp_path: Path) -> None:
    """The write after 3 s never happens: the server got notifications/cancelled; the error says so."""
    log, target = tmp_path / "log", tmp_path / "written"
    audit = InMemoryAudit()
    with MCPToolset(fastmcp(log), name="files", call_timeout=1) as tools:
        gate = Gate(ALLOW_ALL, audit=audit, tools=tools)
        with pytest.raises(ToolFailed) as info:
            gate.call("slow_write", {"path": str(target), "seconds": 3})
        time.sleep(3)
        assert gate.call("add", {"a": 1, "b": 2}) == 3  # the session still works
    text = str(info.value)
    assert "slow_write (MCP server files): timed out after 1s; a cancellation was sent to the server" in text
    assert "may have taken effect" in text
    assert not target.exists()
    assert "cancelled:slow_write" in ran(log)
    outcome = audit.of_kind("call_outcome")[0]
    assert outcome["status"] == "unknown" and "may have taken effect" in outcome["error"]
    assert audit.of_kind("call_intent")[0]["origin"] == "mcp:files"  # the record names the server


@pytest.mark.sandbox
def test_a_program_catches_an_unknown_outcome_by_its_name_and_does_not_repeat_the_call(tmp_path: Path) -> None:
    """`ToolOutcomeUnknown` (a `ToolFailed`) is a name in programs, as the refusals are: a program tells "may have
    taken effect" apart from a plain failure without reading the message."""
    log, target = tmp_path / "log", tmp_path / "written"
    with MCPToolset(fastmcp(log), name="files", call_timeout=1) as tools:
        gate = Gate(ALLOW_ALL, audit=InMemoryAudit(), tools=tools)
        with Interpreter(tools, gate, sandbox="process") as py:
            result = py.run(f"try:\n    slow_write(path={str(target)!r}, seconds=3)\n    said = 'done'\n"
                            "except ToolOutcomeUnknown:\n    said = 'unknown: not repeated'\n"
                            "except ToolFailed:\n    said = 'failed'\nsaid")
        time.sleep(3)
    assert result.error is None and result.value == "unknown: not repeated", result.error
    assert not target.exists()


def test_the_policys_timeout_for_a_tool_is_honoured_the_same_way(tmp_path: Path) -> None:
    log, target = tmp_path / "log", tmp_path / "written"
    policy = Policy.from_dict({"version": 1, "default": "allow", "tools": {"slow_write": {"timeout": "1s"}}})
    with MCPToolset(fastmcp(log), name="files", timeout=30) as tools:
        gate = Gate(policy, tools=tools)
        with pytest.raises(ToolFailed, match=r"timed out after 1s; a cancellation was sent"):
            gate.call("slow_write", {"path": str(target), "seconds": 3})
        time.sleep(3)
    assert not target.exists()


def test_a_server_that_dies_during_a_call_is_reported_as_such(tmp_path: Path) -> None:
    log = tmp_path / "log"
    with MCPToolset(fastmcp(log), name="files", timeout=10) as tools:
        gate = Gate(ALLOW_ALL, tools=tools)
        with pytest.raises(ToolFailed) as info:
            gate.call("die", {})
        with pytest.raises(ToolFailed, match=r"the MCP session is closed") as later:
            gate.call("add", {"a": 1, "b": 2})
    # What to do about it: the server is gone, not the toolset used outside its `with`.
    assert "open a new one" in str(later.value) and "inside `with`" not in str(later.value)
    text = str(info.value)
    assert "die (MCP server files): the connection to the server was lost during the call" in text
    assert "may have taken effect" in text and "CancelledError: \n" not in text + "\n"


@pytest.mark.parametrize("tool", ["bad_shape", "bad_struct"])
def test_a_malformed_answer_is_an_unknown_outcome_that_says_so_and_the_session_goes_on(tool: str,
                                                                                     tmp_path: Path) -> None:
    """The server answered, with something that is no result (or structured content its own output schema
    refuses): the call may have run, so its outcome is unknown; but the connection was not lost, so the
    error must not say it was, and the server's other tools stay callable."""
    audit = InMemoryAudit()
    with MCPToolset(hostile("malformed", tmp_path / "log"), name="odd") as tools:
        gate = Gate(ALLOW_ALL, audit=audit, tools=tools)
        with pytest.raises(ToolFailed) as info:
            gate.call(tool, {})
        assert gate.call("ok_tool", {}) == "done"
    text = str(info.value)
    assert f"{tool} (MCP server odd): the server's answer is not a result proctor can read" in text
    assert "may have taken effect" in text and "connection" not in text
    assert [o["status"] for o in audit.of_kind("call_outcome")] == ["unknown", "ok"]


def test_a_schema_cannot_make_proctor_fetch_a_url(tmp_path: Path) -> None:
    """A server's inputSchema is anyone's: a `$ref` to http://internal-host/… must not have proctor's process
    fetch it (jsonschema's default does, to validate a call's arguments), neither when the toolset opens nor
    at a call. The tool is not offered, saying why."""
    log = tmp_path / "log"
    with internal_host() as (base, fetched):
        url = f"{base}/metadata.json"
        opened = MCPToolset(hostile(f"ref:{url}", log), name="odd")
        with opened as tools:
            assert tools == []
            gate = Gate(ALLOW_ALL, tools=tools)
            with pytest.raises(ToolDenied, match="unknown tool 'peek'"):
                gate.call("peek", {"x": "v"})
    assert fetched == []
    assert f"refers to {url!r} (at /properties/x), which does not resolve within the schema" in opened.withheld["peek"]
    assert "tools/call" not in ran(log)


def test_a_tool_whose_ref_does_not_resolve_is_not_offered_and_the_servers_other_tools_are(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A `$ref` to a missing `#/$defs/x`, or beyond the schema, would refuse every call of the tool: it is found when
    the toolset opens, the tool is left out (a program cannot call it), and one log line says which and why."""
    log = tmp_path / "log"
    toolset = MCPToolset(hostile("badref", log), name="odd")
    with caplog.at_level("WARNING", logger="proctor.mcp"), toolset as tools, \
            Interpreter(tools, Gate(ALLOW_ALL), sandbox="process") as py:
        assert [t.name for t in tools] == ["ok_tool"]
        result = py.run("print(ok_tool())\ntry:\n    peek(x='a')\nexcept NameError as e:\n    print('no', e)")
    assert sorted(toolset.withheld) == ["far", "odd_in", "odd_out", "peek", "tally"]
    # in the output schema, every result would be refused (the SDK checks each), after the call ran
    assert "its outputSchema refers to '#/$defs/count' (at /properties/n)" in toolset.withheld["tally"]
    assert toolset.withheld["odd_out"].startswith("its outputSchema is invalid (7 is not valid under any of")
    # an invalid inputSchema: that tool alone is not offered (it refused the whole toolset before)
    assert toolset.withheld["odd_in"].startswith("its inputSchema is invalid (7 is not valid under any of") and \
        toolset.withheld["odd_in"].endswith("every call would be refused; the server's schema needs fixing")
    assert "refers to '#/$defs/x' (at /properties/x), which does not resolve within the schema" in \
        toolset.withheld["peek"]
    assert "refers to 'http://127.0.0.1:9/schema.json'" in toolset.withheld["far"]
    assert result.error is None and "done" in result.logs and "no name 'peek' is not defined" in result.logs
    lines = [r.getMessage() for r in caplog.records if r.name == "proctor.mcp"]
    assert len(lines) == 5 and any(line.startswith("MCP server odd: tool 'peek' (peek) is not offered: its "
                                                   "inputSchema refers to '#/$defs/x'") for line in lines)
    assert ran(log).count("tools/call") == 1  # ok_tool's alone


def test_a_tool_whose_ref_leads_back_to_itself_without_end_is_not_offered(tmp_path: Path) -> None:
    """A `$ref` cycle that never steps into the value (x is x; a is b, b is a) recursed until Python's stack ran out on
    every call (the gate failed with a RecursionError), or, in an outputSchema, on every result after the call ran:
    such a tool is not offered, saying where; a schema that recurses into its value (a tree) is used as any."""
    log = tmp_path / "log"
    toolset = MCPToolset(hostile("cyclic", log), name="odd")
    with toolset as tools:
        assert sorted(t.name for t in tools) == ["ok_tool", "tree"]
        assert Gate(ALLOW_ALL, tools=tools).call("tree", {"node": {"next": {"next": {}}}}) == "done"
    assert sorted(toolset.withheld) == ["loop", "loop_out", "pair"]
    assert toolset.withheld["loop"] == (
        "its inputSchema refers to '#/properties/x' (at /properties/x), which leads back there without end: every "
        "call would be refused; the server's schema needs fixing")
    assert "its inputSchema refers to '#/$defs/" in toolset.withheld["pair"]
    assert toolset.withheld["loop_out"].startswith(
        "its outputSchema refers to '#' (at /allOf/0), which leads back there without end: every result would be "
        "refused after the call ran")


def _raw(text: str) -> list[str]:
    """The characters of `text` that would reach a terminal or a model unescaped (newline and tab are text)."""
    return [c for c in text if is_invisible(c) and c not in "\n\t"]


def test_control_characters_a_server_writes_reach_no_model_or_terminal_raw(tmp_path: Path) -> None:
    """ANSI escapes, C1 controls, bidi overrides and isolates in a tool's description, title, argument descriptions,
    enum values and in the errors it returns are escaped (visible as \\x1b, \\u202e) everywhere a model reads them:
    the description, the signature, the rendered source, the argument docs, the smolagents tool, the prompt."""
    from proctor.agent.prompts import describe_tools

    with MCPToolset(hostile("controls", tmp_path / "log"), name="odd") as tools:
        paint = next(t for t in tools if t.name == "paint")
        assert isinstance(paint, MCPTool) and paint.rendered is not None
        shown = [paint.description, paint.signature_text(), paint.rendered.source(paint.description),
                 *paint.arg_descriptions.values(), describe_tools(tools, ALLOW_ALL),
                 describe_tools(tools, ALLOW_ALL, python=False),
                 json.dumps(paint.json_schema(), ensure_ascii=False)]  # what a tool-calling model is sent
        for text in shown:
            assert _raw(text) == [], text
        assert "Paint a wall.\\x1b[2J\\x1b[1A\\x9b31m\\u202egnp.exe\\u2066x\\u2069\\u200b\\u3164\nSecond line." \
            in paint.description
        assert "Literal['red\\x1b[2J" in paint.signature_text() and "\\u3164" in paint.signature_text()
        assert "the colour\\x1b[2J" in paint.arg_descriptions["colour"]
        smol = toolset_smolagents(tools)
        assert all(_raw(t.description) == [] and all(_raw(str(i)) == [] for i in t.inputs.values()) for t in smol)
        gate = Gate(ALLOW_ALL, tools=tools)
        for name, args in (("paint", {"colour": "blue"}), ("refuse", {})):
            with pytest.raises(ToolFailed) as info:
                gate.call(name, args)
            assert _raw(str(info.value)) == [] and "\\x1b[2J" in str(info.value), str(info.value)
        with pytest.raises(ToolDenied) as refused:  # the schema's own words, quoted by the argument check
            gate.call("paint", {"colour": "green"})
        assert _raw(str(refused.value)) == [] and "red\\x1b" in str(refused.value)


def test_what_a_stdio_server_prints_on_stderr_reaches_the_terminal_escaped(capfd: pytest.CaptureFixture[str]) -> None:
    """A server's stderr is the operator's terminal: relayed line by line, escaped (a carriage return cannot
    overwrite the line either)."""
    with MCPToolset(hostile("controls"), name="odd") as tools:
        assert tools
    err = capfd.readouterr().err
    assert "starting\\x1b[2J\\x1b[1A\\x9b31m\\u202egnp.exe" in err and "\\x0dhidden\n" in err
    assert _raw(err) == [] and "\r" not in err


def toolset_smolagents(tools: list[Tool]) -> list[Any]:
    from proctor.integrations.smolagents import govern_tools

    return govern_tools(tools, Gate(ALLOW_ALL))


def test_a_schema_nested_beyond_the_depth_bound_stops_the_listing_saying_where(tmp_path: Path) -> None:
    """150 levels parse in the SDK, but validating or rendering them recurses past Python's stack: the listing
    stops with the tool, the limit and the place in its definition (before, a RecursionError escaped open())."""
    with pytest.raises(ToolsetError, match=r"the MCP server odd: tool 'deep''s definition:1:\d+: JSON nested deeper "
                                           r"than 64 levels; flatten it \(max_schema_depth=64\): the listing was "
                                           r"stopped"):
        MCPToolset(hostile("deep:150"), name="odd").open()
    with MCPToolset(hostile("deep:20"), name="odd") as tools:  # a schema within it is used as any
        assert sorted(t.name for t in tools) == ["deep", "ok_tool"]


@pytest.mark.parametrize("tool", ["endless", "huge_answer"])
def test_a_line_past_max_message_bytes_ends_the_session_before_it_is_kept(tool: str) -> None:
    """A stdio server's line is bounded as it comes in, before the SDK would keep it: a line that never ends (or a
    40 MB answer) stops the server at once with why, instead of memory without bound and CPU growing with the
    square of the line (the SDK's own transport: 14 s and 290 MB for the 40 MB answer, the GIL held throughout)."""
    started = time.monotonic()
    with MCPToolset(hostile("flood"), name="hostile", max_message_bytes=1 << 20, call_timeout=60) as tools:
        gate = Gate(ALLOW_ALL, audit=InMemoryAudit(), tools=tools)
        with pytest.raises(ToolFailed) as info:
            gate.call(tool, {})
        with pytest.raises(ToolFailed, match=r"the MCP session is closed"):  # nothing more reaches that server
            gate.call("ok_tool", {})
    assert time.monotonic() - started < 20
    assert str(info.value) == (
        f"{tool}: {tool} (MCP server hostile): the server wrote a line of more than 1048576 bytes "
        "(max_message_bytes=1048576); proctor closed the session and stopped the server; the call may have taken "
        "effect")
    assert type(info.value).__name__ == "ToolOutcomeUnknown"


def test_a_listing_past_max_message_bytes_fails_at_once_saying_why() -> None:
    with pytest.raises(ToolsetError, match=r"^the MCP server hostile failed: the server wrote a line of more than "
                                           r"65536 bytes \(max_message_bytes=65536\); proctor closed the session"):
        MCPToolset(hostile("flood-list"), name="hostile", max_message_bytes=65536, timeout=600).open()
    with MCPToolset(hostile("flood"), name="hostile", max_message_bytes=65536) as tools:  # a line within it is read
        assert Gate(ALLOW_ALL, tools=tools).call("ok_tool", {}) == "done"


def test_blank_lines_are_no_message_and_unreadable_ones_are_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """A blank line is nothing to parse (while listing it had stopped the listing as unreadable); lines that are no
    JSON-RPC are logged once and counted, not one log line each (a server's two bytes made a warning of 300)."""
    with caplog.at_level(logging.WARNING, logger="proctor.mcp"), \
            MCPToolset(hostile("blanks"), name="blanks") as tools:
        assert Gate(ALLOW_ALL, tools=tools).call("plain", {}) == "done"
    said = [r.getMessage() for r in caplog.records if r.name == "proctor.mcp"]
    assert len(said) == 2, said[:3]
    assert said[0].startswith("mcp_unreadable_line error=") and "later ones are counted" in said[0], said[0]
    assert said[1] == "mcp_unreadable_lines count=2000", said[1]


def test_a_process_the_server_leaves_holding_its_stdout_leaves_nothing_open_behind(tmp_path: Path) -> None:
    """A descendant out of the server's process group (which the stop cannot reach) keeps the server's stdout open:
    closing the toolset still closes proctor's end of it, instead of leaving the pipe to the collector, which
    found the toolset's loop closed and printed a traceback on stderr (an error under pytest)."""
    log = tmp_path / "log"
    unraisable: list[str] = []
    previous, sys.unraisablehook = sys.unraisablehook, lambda u: unraisable.append(f"{u.exc_value!r} in {u.object!r}")
    try:
        with MCPToolset(hostile("heir", log), name="heir") as tools:
            assert Gate(ALLOW_ALL, tools=tools).call("plain", {}) == "done"
        gc.collect()
    finally:
        sys.unraisablehook = previous
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(Path(f"{log}.pid").read_text()), signal.SIGKILL)
    assert unraisable == []


@contextmanager
def http_server(script: str, *args: str) -> Iterator[str]:
    """`script` (beside this file) serving MCP on a free localhost port (its first argument, then `args`): its URL,
    once it accepts connections, while it runs."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = subprocess.Popen([sys.executable, str(HERE / script), str(port), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, f"{script} did not start"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)


def hostile_http(mode: str, log: Path) -> AbstractContextManager[str]:
    """`mcp_hostile_http.py` in `mode`: its URL, while it runs."""
    return http_server("mcp_hostile_http.py", mode, str(log))


def test_a_compressed_http_answer_cannot_carry_more_than_max_message_bytes(tmp_path: Path) -> None:
    """The bound counts bytes as they arrive; a gzip body is decompressed after that (200 KB of it made a 200 MB
    answer the session kept whole, past a 1 MiB bound). proctor asks for bodies as they are, and one the server
    compresses all the same is refused before it is decompressed: an unknown outcome saying why, the session closed."""
    log = tmp_path / "log"
    with hostile_http("gzip", log) as url, \
            MCPToolset(url, name="bomb", max_message_bytes=1 << 20, call_timeout=60) as tools:
        gate = Gate(ALLOW_ALL, audit=InMemoryAudit(), tools=tools)
        with pytest.raises(ToolFailed) as info:
            gate.call("bomb", {})
        with pytest.raises(ToolFailed, match=r"the MCP session is closed"):
            gate.call("bomb", {})
    assert type(info.value).__name__ == "ToolOutcomeUnknown"
    assert str(info.value) == (
        "bomb: bomb (MCP server bomb): the server sent a compressed answer (Content-Encoding: gzip) though proctor "
        "asked for none (Accept-Encoding: identity): its size is not known until it is decompressed, so "
        "max_message_bytes cannot bound it; proctor closed the session; the call may have taken effect")
    asked = {line.split()[1] for line in log.read_text().splitlines()}
    assert asked == {"identity"}, asked  # every request, so that a server that honours it never compresses


@pytest.mark.parametrize("mode", ["sse-cr", "sse-split"])
def test_an_sse_stream_of_events_within_max_message_bytes_is_read_whole(mode: str, tmp_path: Path) -> None:
    """The bound is on each event: events that end with CR line ends (as SSE allows), or whose two line ends come in
    different reads, end there all the same (they were counted as one event, and a stream of small ones was cut)."""
    with hostile_http(mode, tmp_path / "log") as url, \
            MCPToolset(url, name="sse", max_message_bytes=65536, call_timeout=60) as tools:
        assert Gate(ALLOW_ALL, tools=tools).call("bomb", {}) == "done"


def test_max_message_bytes_must_be_a_positive_integer() -> None:
    with pytest.raises(ConfigurationError, match=r"max_message_bytes must be a positive integer, got 0"):
        MCPToolset(hostile("plain"), max_message_bytes=0)


def test_a_schemas_patterns_are_checked_within_a_time_bound_and_never_stall_the_process() -> None:
    """A server's pattern that backtracks without end (``^(a+)+$`` on 41 characters: hours in Python's `re`, the GIL
    held, every session of the process stalled) is checked in the regex engine within PATTERN_TIMEOUT_S: the
    argument is refused saying why. Where proctor cannot bound the check (keys under unevaluatedProperties; an
    outputSchema, which the SDK checks with `re`), the tool is not offered."""
    with MCPToolset(hostile("redos"), name="re") as tools:
        toolset = tools[0].toolset
        assert toolset is not None and sorted(t.name for t in tools) == ["keyed", "match_it", "ok_tool", "slow_it"]
        assert "combines unevaluatedProperties with patternProperties" in toolset.withheld["uneval"]
        assert toolset.withheld["out_pattern"].startswith("its outputSchema has regular expressions (pattern, "
                                                          "patternProperties), which the MCP SDK checks every result")
        gate = Gate(ALLOW_ALL, tools=tools)
        started = time.monotonic()
        with pytest.raises(ToolDenied, match=r"does not match '\^\(a\+\)\+\$'"):
            gate.call("match_it", {"s": "a" * 40 + "b"})
        with pytest.raises(ToolDenied, match=r"could not be checked against the pattern '\^\(a\|aa\)\+\$' within "
                                             r"0\.1s \(a pattern that backtracks without end\): refused"):
            gate.call("slow_it", {"s": "a" * 60 + "b"})
        with pytest.raises(ToolDenied, match=r"does not match any of the regexes: '\^x_\(a\+\)\+\$'"):
            gate.call("keyed", {"m": {"x_" + "a" * 40 + "b": 1}})
        assert time.monotonic() - started < 10
        assert gate.call("match_it", {"s": "aaa"}) == "done" and gate.call("keyed", {"m": {"x_aa": 1}}) == "done"


def test_a_listing_the_sdk_cannot_parse_fails_at_once_not_at_the_timeout(tmp_path: Path) -> None:
    """300 levels are beyond what the SDK's parser reads: it drops the line, and the listing would wait for its
    answer until `timeout`. It stops when the unreadable line comes, saying what the SDK found and where."""
    with pytest.raises(ToolsetError, match=r"the MCP server odd sent a message that cannot be read while its tools "
                                           r"were listed: Invalid JSON: recursion limit exceeded at line 1 column "
                                           r"\d+ \(nested too deeply for the MCP SDK to parse: flatten the server's "
                                           r"schemas\); the listing was stopped"):
        MCPToolset(hostile("deeper"), name="odd", timeout=600).open()


def test_models_see_faithful_signatures(tmp_path: Path) -> None:
    """Nested input types, nullability, defaults and the return type from the output schema."""
    with MCPToolset(fastmcp(tmp_path / "log")) as tools:
        ship = next(t for t in tools if t.name == "ship")
        add = next(t for t in tools if t.name == "add")
    assert str(ship.signature) == ("(to: Address, count: int, note: str | None = None, express: bool = False)"
                                   " -> dict[str, str]")
    assert "class Address(TypedDict):\n    street: str\n    zip: str | None" in ship.description
    assert str(add.signature) == "(a: int, b: int) -> int"


def test_render_signature_covers_the_schema_forms() -> None:
    schema = {
        "type": "object",
        "properties": {
            "customer": {"$ref": "#/$defs/Customer"},
            "lines": {"type": "array", "items": {"type": "object", "properties": {
                "sku": {"type": "string"}, "qty": {"type": "integer", "default": 1}}, "required": ["sku"]}},
            "tail": {"type": "number"},
            "mode": {"enum": ["fast", "slow"]},
            "tags": {"type": "object", "additionalProperties": {"type": "string"}},
            "at": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": "now"},
        },
        "required": ["customer", "lines"],
        "$defs": {"Customer": {"type": "object", "description": "A buyer.", "properties": {
            "name": {"type": "string", "description": "Full name"}, "email": {"type": ["string", "null"]}},
            "required": ["name"]}},
    }
    sig = render_signature("create_order", schema, {"type": "object", "properties": {"id": {"type": "string"}},
                                                    "required": ["id"]})
    assert sig.def_line() == ("create_order(customer: Customer, lines: list[Line], tail: float | None = None, "
                              "mode: Literal['fast', 'slow'] | None = None, tags: dict[str, str] | None = None, "
                              "at: str | None = 'now') -> CreateOrderResult")
    assert sig.types["Customer"] == ('class Customer(TypedDict):\n    """A buyer."""\n'
                                     "    name: str  # Full name\n    email: NotRequired[str | None]")
    assert "qty: NotRequired[int]" in sig.types["Line"]
    assert sig.types["CreateOrderResult"] == "class CreateOrderResult(TypedDict):\n    id: str"
    # A cycle is named, not followed; a hostile schema never raises.
    cyclic = {"type": "object", "properties": {"node": {"$ref": "#/$defs/Node"}}, "required": ["node"],
              "$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}}}
    assert render_signature("walk", cyclic).def_line().startswith("walk(node: Node")
    assert render_signature("odd", {"properties": {"x": {"type": 7, "anyOf": "no"}}}).def_line() == \
        "odd(x: Any = None)"


def test_current_fastmcp_over_streamable_http(tmp_path: Path) -> None:
    """The `fastmcp` package (4.x) as the server: signatures from its schemas, annotations ignored."""
    # fastmcp 4 needs mcp 2: `make test-mcp1` deselects this test in the 1.x venv.
    log = tmp_path / "log"
    with http_server("fastmcp4_server.py", str(log)) as url:
        policy = Policy.from_dict({"version": 1, "default": "deny", "tools": {"norm": {"side_effect": "read"}},
                                   "rules": [{"name": "reads", "match": {"side_effect": "read"},
                                              "decision": "allow"}]})
        with MCPToolset(url, name="f4") as tools:
            by_name = {t.name: t for t in tools}
            assert by_name["wipe_disk"].side_effect == "destructive"
            assert str(by_name["norm"].signature) == "(p: P, scale: int = 1) -> float"  # fastmcp inlines, untitled
            assert "class P(TypedDict):\n    x: float\n    y: NotRequired[float | None]" in \
                by_name["norm"].description
            gate = Gate(policy, tools=tools)
            assert gate.call("norm", {"p": {"x": 3, "y": 4}}) == 5.0
            with pytest.raises(ToolDenied):
                gate.call("wipe_disk", {"disk": "sda"})
    assert ran(log) == ["norm"]
