"""Code mode with parts nobody here wrote: the npm reference servers as upstreams (started by npx), and
the MCP Inspector's command-line client over stdio and streamable HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import mcp.types as mt

from codemode.helpers import audit_records, free_port, http_server, serve_args, stdio_session, text, write_config
from proctor.approval.tokens import add_token

NPX = ["npx", "-y"]
# The newest Inspector (its CLI mode takes --header for the bearer token); npm warns that it wants a
# newer node than some machines have, and it runs there all the same.
INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"
POLICY = """\
version: 1
default: deny
tools:
  files_list_directory: {side_effect: read}
  files_read_text_file: {side_effect: read}
  files_write_file: {side_effect: write}
  memory_create_entities: {side_effect: write}
  memory_read_graph: {side_effect: read}
  everything_get_sum: {side_effect: read}
rules:
  - name: reads
    match: {side_effect: read}
    decision: allow
  - name: memory-writes
    match: {tool: memory_create_entities}
    decision: allow
  - name: file-writes-need-a-human
    match: {tool: files_write_file}
    decision: require_approval
    reason: writing a file needs a human
approval:
  timeout: 30s
"""


def upstreams(data: Path) -> dict[str, Any]:
    return {
        "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", str(data)]},
        "memory": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"],
                   "env": {"MEMORY_FILE_PATH": str(data.parent / "memory.json")}},
        "everything": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-everything"]},
    }


def data_dir(tmp: Path, n: int = 6) -> Path:
    data = tmp / "data"
    data.mkdir()
    for i in range(n):
        (data / f"note{i}.txt").write_text(f"note {i}\n" + ("status: urgent\n" if i % 2 else "status: fine\n"))
    return data


PROGRAM = """\
listing = files_list_directory(path=DATA)['content']
names = sorted(line.split('] ', 1)[1] for line in listing.splitlines() if line.startswith('[FILE]'))
urgent = [n for n in names if 'urgent' in files_read_text_file(path=DATA + '/' + n)['content']]
files_write_file(path=DATA + '/summary.txt', content='urgent: ' + ', '.join(urgent))
memory_create_entities(entities=[{'name': 'summary', 'entityType': 'report', 'observations': urgent}])
graph = memory_read_graph()
(urgent, everything_get_sum(a=2, b=3), [e['name'] for e in graph['entities']])
"""


def test_the_npm_reference_servers_are_governed_upstreams(tmp_path: Path) -> None:
    data = data_dir(tmp_path)
    servers, policy, audit = write_config(tmp_path, upstreams(data), POLICY)
    asked: list[str] = []

    async def approve(context: Any, params: Any) -> Any:
        asked.append(params.model_dump(by_alias=True).get("message", ""))
        return mt.ElicitResult(action="accept", content={"approve": True, "reason": "ok"})

    async def go() -> tuple[str, str, str]:
        async with stdio_session(serve_args(servers, policy, audit, "--user", "dana"), approve) as s:
            sig = text(await s.call_tool("describe_tool", {"name": "files_read_text_file"}))
            out = text(await s.call_tool("run_python", {"code": f"DATA = {str(data)!r}\n" + PROGRAM}))
            refused = text(await s.call_tool("run_python", {"code": "files_move_file(source=DATA, destination='/x')"}))
            return sig, out, refused

    sig, out, refused = asyncio.run(go())
    assert "def files_read_text_file(path: str, tail: float | None = None, head: float | None = None)" \
        " -> FilesReadTextFileResult:" in sig
    assert "value: (['note1.txt', 'note3.txt', 'note5.txt'], 'The sum of 2 and 3 is 5.', ['summary'])" in out
    assert (data / "summary.txt").read_text() == "urgent: note1.txt, note3.txt, note5.txt"
    assert len(asked) == 1 and "files_write_file (write)" in asked[0]
    assert "ToolDenied" in refused and "no rule matched" in refused
    outcomes = [(r["tool"], r["status"]) for r in audit_records(audit) if r["kind"] == "call_outcome"]
    assert outcomes.count(("files_read_text_file", "ok")) == 6
    assert ("files_write_file", "ok") in outcomes and ("files_move_file", "denied") in outcomes


def inspector(*args: str) -> Any:
    out = subprocess.run([*NPX, INSPECTOR, "--cli", *args, "--connect-timeout", "120000"], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "NO_COLOR": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_the_mcp_inspector_cli_over_stdio(tmp_path: Path) -> None:
    data = data_dir(tmp_path, 3)
    servers, policy, audit = write_config(tmp_path, {"files": upstreams(data)["files"]}, POLICY)
    cmd = [sys.executable, *serve_args(servers, policy, audit, "--user", "erin")]
    listed = inspector(*cmd, "--method", "tools/list")
    assert sorted(t["name"] for t in listed["tools"]) == ["describe_tool", "run_python", "search_tools"]
    code = f"[files_read_text_file(path={str(data / 'note1.txt')!r})['content'], files_move_file(source='a', " \
           "destination='b')]"
    result = inspector(*cmd, "--method", "tools/call", "--tool-name", "run_python", "--tool-arg", f"code={code}")
    body = result["content"][0]["text"]
    assert "files_read_text_file  allow" in body and "ToolDenied" in body
    records = audit_records(audit)  # a run starts at a session's first program, and ends with the session
    assert [r["principal"] for r in records if r["kind"] == "run_started"] == ["erin"]
    assert [r["status"] for r in records if r["kind"] == "run_finished"] == ["done"]


def test_the_mcp_inspector_cli_over_http(tmp_path: Path) -> None:
    data = data_dir(tmp_path, 3)
    servers, policy, audit = write_config(tmp_path, {"files": upstreams(data)["files"]}, POLICY)
    tokens = tmp_path / "tokens.txt"
    token = add_token(tokens, "frank")
    port = free_port()
    with http_server(serve_args(servers, policy, audit, "--http", f"127.0.0.1:{port}", "--tokens", str(tokens)),
                     port):
        url = f"http://127.0.0.1:{port}/mcp"
        code = f"files_read_text_file(path={str(data / 'note2.txt')!r})['content']"
        result = inspector(url, "--transport", "http", "--header", f"Authorization: Bearer {token}",
                           "--method", "tools/call", "--tool-name", "run_python", "--tool-arg", f"code={code}")
        refused = subprocess.run([*NPX, INSPECTOR, "--cli", url, "--transport", "http", "--stored-auth-only",
                                  "--method", "tools/list"], capture_output=True, text=True, timeout=300)
    assert "value: 'note 2\\nstatus: fine\\n'" in result["content"][0]["text"]
    # Without the token the server answers 401; the Inspector then asks for OAuth, which it cannot do here.
    assert refused.returncode != 0 and "auth_required" in refused.stdout + refused.stderr
    assert [r["principal"] for r in audit_records(audit) if r["kind"] == "run_started"] == ["frank"]
