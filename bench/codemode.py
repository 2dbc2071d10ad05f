"""Code mode (`proctor mcp serve`) beside direct MCP tool calling, side by side in one run.

(a) **Context bytes** for "read 20 files from the filesystem server, keep those that match, write a
    summary": what reaches the model's context under direct tool calling (every tool definition of
    the server, then each call's arguments and each result) versus code mode through proctor (its
    three tool definitions, the `describe_tool` answers for the three functions used, the program and
    the `run_python` result). Both are measured on the real servers: the bytes are the JSON the
    client receives (definitions) and the text the model reads (arguments, results).
(b) **Cost added to one upstream call**: N calls of the filesystem server's `get_file_info` made
    directly by an MCP client session over stdio, versus the same N calls made by one `run_python`
    program through proctor (each call decided, audited and traced), per call, batches of each
    alternating with both sessions open. Target <= 1.10x.

Needs npx (`@modelcontextprotocol/server-filesystem` is fetched on first use). Run:
`.venv/bin/python bench/codemode.py [--calls N]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

FS = "@modelcontextprotocol/server-filesystem"
POLICY = """\
version: 1
default: deny
tools:
  files_list_directory: {side_effect: read}
  files_read_text_file: {side_effect: read}
  files_get_file_info: {side_effect: read}
  files_write_file: {side_effect: write}
rules:
  - name: reads
    match: {side_effect: read}
    decision: allow
  - name: summary
    match: {tool: files_write_file}
    decision: allow
"""
PROGRAM = """\
names = sorted(l.split('] ', 1)[1] for l in files_list_directory(path=DATA)['content'].splitlines()
               if l.startswith('[FILE]'))
hits = [n for n in names if 'ERROR' in files_read_text_file(path=f'{DATA}/{n}')['content']]
files_write_file(path=f'{DATA}/summary.txt', content='files with errors: ' + ', '.join(hits))
hits
"""


def wire(model: Any) -> dict[str, Any]:
    data = model.model_dump(by_alias=True, mode="json", exclude_none=True)
    return data if isinstance(data, dict) else {}


def texts(result: Any) -> str:
    return "\n".join(str(c.get("text", "")) for c in wire(result).get("content", []) if c.get("type") == "text")


def make_data(root: Path, n: int = 20) -> Path:
    data = root / "data"
    data.mkdir()
    for i in range(n):
        lines = [f"2026-12-01T10:{i:02d}:{j:02d} INFO request {j} served in {j * 3} ms" for j in range(40)]
        if i % 4 == 0:
            lines[17] = f"2026-12-01T10:{i:02d}:17 ERROR upstream timed out"
        (data / f"service{i:02d}.log").write_text("\n".join(lines) + "\n")
    return data


async def direct(data: Path) -> int:
    """Bytes the model reads with the filesystem server used directly."""
    params = StdioServerParameters(command="npx", args=["-y", FS, str(data)])
    async with stdio_client(params) as streams, ClientSession(streams[0], streams[1]) as s:
        await s.initialize()
        total = len(json.dumps(wire(await s.list_tools())))  # every definition, up front
        listing_args = {"path": str(data)}
        listing = await s.call_tool("list_directory", listing_args)
        total += len(json.dumps(listing_args)) + len(texts(listing))
        hits = []
        for line in texts(listing).splitlines():
            if not line.startswith("[FILE]"):
                continue
            name = line.split("] ", 1)[1]
            args = {"path": f"{data}/{name}"}
            body = texts(await s.call_tool("read_text_file", args))
            total += len(json.dumps(args)) + len(body)  # each intermediate result goes through the model
            if "ERROR" in body:
                hits.append(name)
        args = {"path": f"{data}/summary.txt", "content": "files with errors: " + ", ".join(hits)}
        total += len(json.dumps(args)) + len(texts(await s.call_tool("write_file", args)))
    return total


def proctor_server(data: Path, root: Path) -> StdioServerParameters:
    (root / "servers.json").write_text(json.dumps({"mcpServers": {"files": {"command": "npx",
                                                                            "args": ["-y", FS, str(data)]}}}))
    (root / "policy.yaml").write_text(POLICY)
    return StdioServerParameters(command=sys.executable, args=[
        "-m", "proctor.cli", "mcp", "serve", "--servers", str(root / "servers.json"), "--policy",
        str(root / "policy.yaml"), "--audit", str(root / "audit.jsonl"), "--user", "bench"])


async def code_mode(data: Path, root: Path) -> tuple[int, str]:
    """(bytes the model reads, the program's answer) through proctor."""
    async with stdio_client(proctor_server(data, root)) as streams, ClientSession(streams[0], streams[1]) as s:
        await s.initialize()
        total = len(json.dumps(wire(await s.list_tools())))
        for name in ("files_list_directory", "files_read_text_file", "files_write_file"):
            args = {"name": name}
            total += len(json.dumps(args)) + len(texts(await s.call_tool("describe_tool", args)))
        args = {"code": f"DATA = {str(data)!r}\n" + PROGRAM}
        answer = texts(await s.call_tool("run_python", args))
        total += len(json.dumps(args)) + len(answer)
    return total, answer


async def timed(data: Path, root: Path, calls: int, rounds: int) -> tuple[float, float]:
    """Seconds per get_file_info call, (direct, governed): both sessions open at once, batches of `calls`
    alternating `rounds` times (a shared machine's load then weighs on both alike), medians."""
    info = f"{data}/service00.log"
    direct_params = StdioServerParameters(command="npx", args=["-y", FS, str(data)])
    async with stdio_client(direct_params) as d_streams, ClientSession(d_streams[0], d_streams[1]) as d, \
            stdio_client(proctor_server(data, root)) as p_streams, ClientSession(p_streams[0], p_streams[1]) as p:
        await d.initialize()
        await p.initialize()
        one = {"code": f"files_get_file_info(path={info!r})\nNone"}
        loop = {"code": f"for _ in range({calls}):\n    files_get_file_info(path={info!r})\nNone"}
        await p.call_tool("run_python", one)  # warm: the sandbox is up
        await d.call_tool("get_file_info", {"path": info})
        direct_s: list[float] = []
        governed_s: list[float] = []
        for _ in range(rounds):
            started = time.perf_counter()
            for _ in range(calls):
                await d.call_tool("get_file_info", {"path": info})
            direct_s.append((time.perf_counter() - started) / calls)
            started = time.perf_counter()
            await p.call_tool("run_python", one)
            single = time.perf_counter() - started
            started = time.perf_counter()
            await p.call_tool("run_python", loop)
            governed_s.append((time.perf_counter() - started - single) / (calls - 1))  # a program's fixed cost out
    return statistics.median(direct_s), statistics.median(governed_s)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200, help="calls per batch for (b) (default 200)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating batches for (b) (default 5)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = make_data(root)
        direct_bytes = asyncio.run(direct(data))
        (data / "summary.txt").unlink()
        mode_bytes, answer = asyncio.run(code_mode(data, root))
        direct_call, mode_call = asyncio.run(timed(data, root, args.calls, args.rounds))
    if "service00.log" not in answer:
        print(f"code mode did not do the task:\n{answer}", file=sys.stderr)
        return 1
    print("(a) bytes reaching the model's context: read 20 files, keep matches, write a summary")
    print(f"    direct tool calling  {direct_bytes:>9,} B")
    print(f"    code mode (proctor)  {mode_bytes:>9,} B   {mode_bytes / direct_bytes:.2f}x")
    print(f"(b) one upstream stdio call (filesystem get_file_info; median of {args.rounds} alternating batches "
          f"of {args.calls})")
    print(f"    direct MCP session   {direct_call * 1e6:>9,.0f} us")
    print(f"    governed, run_python {mode_call * 1e6:>9,.0f} us   {mode_call / direct_call:.2f}x (target <= 1.10x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
