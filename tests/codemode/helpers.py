"""Start `proctor mcp serve` for real and talk to it with the mcp SDK's own client."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TextIO

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

HERE = Path(__file__).parent
FASTMCP = HERE.parent / "integrations" / "mcp_server.py"

POLICY = """\
version: 1
default: deny
tools:
  t_add: {side_effect: read}
  t_get_weather: {side_effect: read}
  t_get_stats: {side_effect: read}
  t_delete_file: {side_effect: destructive}
budgets:
  - name: run-calls
    limit: {calls: 10}
rules:
  - name: reads
    match: {side_effect: [none, read]}
    decision: allow
  - name: deletes-need-a-human
    match: {tool: t_delete_file}
    decision: require_approval
    reason: deleting a file needs a human
approval:
  timeout: 3s
"""


def write_config(tmp: Path, servers: dict[str, Any] | None = None, policy: str = POLICY) -> tuple[Path, Path, Path]:
    """(servers.json, policy.yaml, audit.jsonl) in `tmp`; by default one upstream: the FastMCP test server."""
    log = tmp / "upstream.log"
    servers = servers if servers is not None else {
        "t": {"command": sys.executable, "args": [str(FASTMCP), "stdio", "-", str(log)]}}
    (tmp / "servers.json").write_text(json.dumps({"mcpServers": servers}))
    (tmp / "policy.yaml").write_text(policy)
    return tmp / "servers.json", tmp / "policy.yaml", tmp / "audit.jsonl"


def serve_args(servers: Path, policy: Path, audit: Path, *extra: str) -> list[str]:
    return ["-m", "proctor.cli", "mcp", "serve", "--servers", str(servers), "--policy", str(policy),
            "--audit", str(audit), *extra]


def text(result: Any) -> str:
    data = result.model_dump(by_alias=True, mode="json")
    return "\n".join(str(c.get("text", "")) for c in data.get("content", []) if c.get("type") == "text")


Elicit = Callable[[Any, Any], Awaitable[Any]]

#: The client's first message, for tests that speak JSON-RPC by hand (over HTTP, or over a server's pipes).
INITIALIZE: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
INITIALIZED: dict[str, Any] = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def raw_run_python(proc: subprocess.Popen[bytes], code: str) -> None:
    """Be the MCP client by hand over the pipes of a stdio `proctor mcp serve` (so that a test closes or signals
    them when it likes): initialize, then ask `run_python` to run `code` (request id 2, answered on stdout)."""
    assert proc.stdin is not None and proc.stdout is not None

    def send(message: dict[str, Any]) -> None:
        proc.stdin.write((json.dumps(message) + "\n").encode())  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]

    send(INITIALIZE)
    assert json.loads(proc.stdout.readline())["id"] == 1
    send(INITIALIZED)
    send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "run_python",
                                                                      "arguments": {"code": code}}})


@asynccontextmanager
async def stdio_session(args: list[str], elicit: Elicit | None = None,
                        errlog: TextIO | None = None) -> AsyncIterator[ClientSession]:
    """A session of the SDK's client with `proctor ARGS` over stdio; the server's stderr goes to `errlog`."""
    params = StdioServerParameters(command=sys.executable, args=args)
    async with stdio_client(params, errlog=errlog or sys.stderr) as streams, \
            ClientSession(streams[0], streams[1], elicitation_callback=elicit) as session:
        await session.initialize()
        yield session


@asynccontextmanager
async def http_session(url: str, token: str, elicit: Elicit | None = None) -> AsyncIterator[ClientSession]:
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http, \
            streamable_http_client(url, http_client=http) as streams, \
            ClientSession(streams[0], streams[1], elicitation_callback=elicit) as session:
        await session.initialize()
        yield session


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def http_server(args: list[str], port: int) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 90
    try:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    err = proc.stderr.read().decode() if proc.stderr else ""
                    raise RuntimeError(f"proctor mcp serve did not start: {err}") from None
                time.sleep(0.2)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if proc.stderr:
            proc.stderr.close()


def audit_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
